//! Text that another process controls (comm, paths, symbol names, cgroup names), made
//! safe to print: one escaping, applied at the edges where it is shown (terminal tables
//! and stderr lines, Prometheus labels); JSON keeps the raw text (serde escapes it).

use std::borrow::Cow;

/// A character that would act on a terminal instead of showing: C0 and C1 controls
/// (escape sequences, newlines, carriage returns), DEL, and the bidirectional overrides
/// and isolates that reorder what follows them.
fn acts(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every control character written as an escape (`\n`, `\r`, `\t`, `\x1b`,
/// `\u{202e}`): shows on one line, changes nothing on the terminal, and cannot forge a
/// line of output. Borrowed when there is nothing to escape (the usual case).
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(acts) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if acts(c) && (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if acts(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Longest name from another process (a symbol, a path, a comm) kept where it is
/// stored or drawn: as long as the longest demangled name (cpi-user/src/binary/demangle.rs)
/// and twice `PATH_MAX`. A longer one is cut ([`budget`]): one process's 256 KiB symbol,
/// named in every call path that reaches it, made a 639 MB page of a 1.3 MB profile.
pub const MAX_NAME_BYTES: usize = 8 << 10;

/// `s` cut to at most [`MAX_NAME_BYTES`] at a character boundary, ending with how much
/// was cut (`…[+M bytes]`). Borrowed when it fits; a cut name fits, so cutting again
/// changes nothing.
pub fn budget(s: &str) -> Cow<'_, str> {
    if s.len() <= MAX_NAME_BYTES {
        return Cow::Borrowed(s);
    }
    // Room for the ending: "…[+" and "bytes]" and up to 20 digits.
    let mut end = MAX_NAME_BYTES - 32;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…[+{} bytes]", &s[..end], s.len() - end))
}

/// [`budget`] in place.
pub fn budget_in_place(s: &mut String) {
    if s.len() > MAX_NAME_BYTES {
        let cut = budget(s).into_owned();
        *s = cut;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_cut_saying_how_much_once() {
        assert!(matches!(budget("main"), Cow::Borrowed("main")));
        let long = "é".repeat(100_000);
        let cut = budget(&long);
        assert!(cut.len() <= MAX_NAME_BYTES, "{}", cut.len());
        let kept = cut.split('…').next().unwrap();
        assert!(long.starts_with(kept));
        assert!(cut.ends_with(&format!("…[+{} bytes]", long.len() - kept.len())));
        assert!(matches!(budget(&cut), Cow::Borrowed(_)));
    }

    #[test]
    fn controls_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(escape("python3 /usr/lib/x.so"), Cow::Borrowed(_)));
        assert_eq!(
            escape("\x1b[2J\x1b[31mX\nFAKE\r"),
            "\\x1b[2J\\x1b[31mX\\nFAKE\\r"
        );
        assert_eq!(escape("a\u{202e}b\u{9b}c\u{7f}"), "a\\u{202e}b\\x9bc\\x7f");
        assert_eq!(escape("naïve 函数"), "naïve 函数");
    }
}
