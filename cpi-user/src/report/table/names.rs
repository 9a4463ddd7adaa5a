//! Short function names for a terminal, as perf shortens C++ templates: template
//! arguments and argument lists collapsed to `<…>` and `(…)`, the return type of a
//! function template dropped (`void fill<int>(std::vector<int>&)` → `fill<…>(…)`). The
//! tables on a terminal show the short name ([`shortened`]); `--annotate` and
//! `--callers` accept it beside the full one, and a short name that stands for several
//! functions is refused with them listed.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};

use crate::profile::Profile;

/// `name` shortened: every `<…>` and `(…)` outside a Rust qualified path collapsed,
/// a leading return type dropped. C names come back as they are.
pub(crate) fn short_name(name: &str) -> Cow<'_, str> {
    shorter(name, true)
}

/// `name` shortened, its argument list collapsed too when `args`.
fn shorter(name: &str, args: bool) -> Cow<'_, str> {
    if !name.contains(['<', '(']) {
        return Cow::Borrowed(name);
    }
    let collapsed = collapse(name, args);
    let dropped = drop_return_type(&collapsed);
    if dropped == name {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(dropped.to_string())
    }
}

/// The operators whose spelling holds a bracket: kept whole, never collapsed.
const OPERATORS: [&str; 10] = ["<<=", ">>=", "<=>", "<<", ">>", "<=", ">=", "->", "()", "<"];

/// `s` with bracketed groups collapsed (see [`short_name`]).
fn collapse(s: &str, args: bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        // `operator<`, `operator()`: the brackets are the name.
        if out.ends_with("operator") {
            if let Some(op) = OPERATORS.iter().find(|op| rest.starts_with(**op)) {
                out.push_str(op);
                rest = &rest[op.len()..];
                continue;
            }
        }
        // `(anonymous namespace)` is a scope, not an argument list.
        if rest.starts_with("(anonymous namespace)") {
            out.push_str("(anonymous namespace)");
            rest = &rest["(anonymous namespace)".len()..];
            continue;
        }
        let close = match c {
            '<' => '>',
            '(' if args => ')',
            _ => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
                continue;
            }
        };
        let Some(end) = matching(rest, c, close) else {
            // Unbalanced: the rest as it is.
            out.push_str(rest);
            break;
        };
        let inner = &rest[1..end];
        // A Rust qualified path (`<T as Trait>::f`) names the function: shortened inside.
        let qualified = c == '<' && (out.is_empty() || out.ends_with("::"));
        out.push(c);
        if qualified {
            out.push_str(&collapse(inner, args));
        } else if !inner.is_empty() {
            out.push('…');
        }
        out.push(close);
        rest = &rest[end + 1..];
    }
    out
}

/// The index in `s` (which starts with `open`) of the `close` that balances it.
fn matching(s: &str, open: char, close: char) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

/// `s` without a return type before its name: the text up to the last space before
/// the name (the name ends where its argument list starts; `operator new` keeps its
/// space).
fn drop_return_type(s: &str) -> &str {
    let name_end = s
        .find("(…)")
        .or_else(|| s.find("()"))
        .or_else(|| s.find('('))
        .unwrap_or(s.len());
    let head = &s[..name_end];
    let head = head.find("operator").map_or(head, |at| &head[..at]);
    // A space inside a Rust qualified path is not a return type.
    if s.starts_with('<') {
        return s;
    }
    // The last space outside brackets (`(anonymous namespace)` has one inside).
    let mut depth = 0i32;
    let mut last = None;
    for (i, c) in head.char_indices() {
        match c {
            '(' | '<' => depth += 1,
            ')' | '>' => depth -= 1,
            ' ' if depth == 0 => last = Some(i),
            _ => {}
        }
    }
    last.map_or(s, |at| &s[at + 1..])
}

/// A copy of `p` with every function named as a terminal shows it (functions, frames,
/// call edges, the accuracy's functions and paths), and the full names of those
/// renamed. A name is its [`short_name`] unless another name of the profile shortens
/// to the same; then with its argument list (`work(int)`, `work(double)`), else whole:
/// each name shown stands for one function.
pub fn shortened(p: &Profile) -> (Profile, HashMap<String, String>) {
    let mut q = p.clone();
    let mut all: BTreeSet<String> = BTreeSet::new();
    each_name(&mut q, |n| {
        all.insert(n.clone());
    });
    let mut shown: HashMap<&str, String> = all
        .iter()
        .map(|n| (n.as_str(), short_name(n).into_owned()))
        .collect();
    for level in [Some(false), None] {
        let mut count: HashMap<&str, usize> = HashMap::new();
        for v in shown.values() {
            *count.entry(v.as_str()).or_default() += 1;
        }
        let clashes: Vec<&str> = shown
            .iter()
            .filter(|(_, v)| count[v.as_str()] > 1)
            .map(|(k, _)| *k)
            .collect();
        for k in clashes {
            let v = level.map_or(Cow::Borrowed(k), |args| shorter(k, args));
            shown.insert(k, v.into_owned());
        }
    }
    let full: HashMap<String, String> = shown
        .iter()
        .filter(|(k, v)| *k != v)
        .map(|(k, v)| (v.clone(), k.to_string()))
        .collect();
    each_name(&mut q, |n| {
        if let Some(v) = shown.get(n.as_str()) {
            *n = v.clone();
        }
    });
    (q, full)
}

/// Calls `f` on every function name of `p`.
fn each_name(p: &mut Profile, mut f: impl FnMut(&mut String)) {
    for pr in &mut p.processes {
        pr.functions.iter_mut().for_each(|x| f(&mut x.name));
        for c in &mut pr.calls {
            f(&mut c.caller);
            f(&mut c.callee);
        }
        for fr in pr.stacks.iter_mut().flat_map(|s| s.frames.iter_mut()) {
            f(&mut fr.function);
        }
    }
    if let Some(a) = &mut p.accuracy {
        a.functions.iter_mut().for_each(|x| f(&mut x.name));
        a.paths
            .iter_mut()
            .flat_map(|x| x.frames.iter_mut())
            .for_each(f);
    }
}

/// Whether `asked` names the function `name` by its short name: the short name itself,
/// written with `...` or `…`, or without its argument list (`fill<…>`).
pub(crate) fn is_short_for(asked: &str, name: &str) -> bool {
    let short = short_name(name);
    if short == name {
        return false;
    }
    let asked = asked.replace("...", "…");
    let bare = short
        .strip_suffix("(…)")
        .or_else(|| short.strip_suffix("()"))
        .unwrap_or(&short);
    asked == short || asked == bare
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_and_arguments_collapse() {
        let cases = [
            (
                "std::vector<int, std::allocator<int> >::push_back(int const&)",
                "std::vector<…>::push_back(…)",
            ),
            (
                "void fill<int>(std::vector<int, std::allocator<int> >&, int)",
                "fill<…>(…)",
            ),
            (
                "unsigned long mix<unsigned long>(unsigned long)",
                "mix<…>(…)",
            ),
            (
                "shapes::Square::area() const",
                "shapes::Square::area() const",
            ),
            (
                "(anonymous namespace)::spin(int)",
                "(anonymous namespace)::spin(…)",
            ),
            ("std::operator<<(std::ostream&, char)", "std::operator<<(…)"),
            (
                "bool std::operator< <char>(std::string const&, std::string const&)",
                "std::operator< <…>(…)",
            ),
            ("Foo::operator()(int) const", "Foo::operator()(…) const"),
            ("operator new(unsigned long)", "operator new(…)"),
            (
                "<alloc::vec::Vec<u8> as core::ops::drop::Drop>::drop",
                "<alloc::vec::Vec<…> as core::ops::drop::Drop>::drop",
            ),
            (
                "core::ptr::drop_in_place<alloc::string::String>",
                "core::ptr::drop_in_place<…>",
            ),
            ("msort_with_tmp.part.0", "msort_with_tmp.part.0"),
            ("broken<int(", "broken<int("),
        ];
        for (full, short) in cases {
            assert_eq!(short_name(full), short, "{full}");
        }
    }

    #[test]
    fn overloads_keep_their_argument_lists() {
        let cases = [
            ("work(int)", "work(…)", "work(int)"),
            ("work(double)", "work(…)", "work(double)"),
        ];
        for (full, short, args) in cases {
            assert_eq!(short_name(full), short);
            assert_eq!(shorter(full, false), args);
        }
        assert_eq!(
            shorter("void fill<int>(std::vector<int>&)", false),
            "fill<…>(std::vector<…>&)"
        );
    }

    #[test]
    fn short_forms_name_the_function() {
        let full = "void fill<int>(std::vector<int, std::allocator<int> >&, int)";
        for asked in ["fill<…>(…)", "fill<…>", "fill<...>", "fill<...>(...)"] {
            assert!(is_short_for(asked, full), "{asked}");
        }
        assert!(!is_short_for("fill", full));
        assert!(!is_short_for("main", "main"), "a C name has no short form");
    }
}
