//! Names people read: C++ (Itanium ABI, `_Z…`) and Rust (legacy `_ZN…17h<hash>E` and v0
//! `_R…`) symbol names demangled. Symbol names come from binaries other users control,
//! so both the mangled input and the demangled output are bounded: a name too long, too
//! deep or not mangled at all is returned as it is.
//!
//! Profiles name functions by the demangled form and keep the symbol beside it
//! (cpi-user/src/profile/model.rs, `FunctionProfile::mangled`): BOLT's `.fdata` needs the
//! symbol (cpi-user/src/report/fdata.rs).

use std::borrow::Cow;
use std::fmt::{self, Write};

/// Longest symbol name demangled.
const MAX_MANGLED: usize = 16 << 10;
/// Longest demangled name kept (template-heavy C++ names run to a few KiB); a longer one
/// leaves the symbol as it is.
const MAX_DEMANGLED: usize = 8 << 10;
/// Nesting depth the C++ parser and printer may reach.
const CPP_RECURSION: u32 = 256;

/// The demangled form of symbol `name`, or `name` itself when it is not a Rust or C++
/// mangled name (C, kernel and `[anon]` names) or cannot be demangled within the bounds.
/// Rust names are shown without their hash (`std::rt::lang_start`), as perf, pprof and
/// Pyroscope show them.
pub fn demangle(name: &str) -> Cow<'_, str> {
    if !may_be_mangled(name) {
        return Cow::Borrowed(name);
    }
    // A legacy Rust name is a valid Itanium name too: Rust first, which checks its hash.
    rust(name)
        .or_else(|| cpp(name))
        .map_or(Cow::Borrowed(name), Cow::Owned)
}

/// Whether [`demangle`] may change `name` (the cheap test it starts with): names that
/// fail it are shown as they are, with nothing to cache.
pub(crate) fn may_be_mangled(name: &str) -> bool {
    name.len() <= MAX_MANGLED && (name.starts_with("_Z") || name.starts_with("_R"))
}

fn rust(name: &str) -> Option<String> {
    let d = rustc_demangle::try_demangle(name).ok()?;
    let mut out = Bounded::default();
    write!(out, "{d:#}").ok()?;
    Some(out.0)
}

fn cpp(name: &str) -> Option<String> {
    let parse = cpp_demangle::ParseOptions::default().recursion_limit(CPP_RECURSION);
    let sym = cpp_demangle::BorrowedSymbol::new_with_options(name.as_bytes(), &parse).ok()?;
    let opts = cpp_demangle::DemangleOptions::new().recursion_limit(CPP_RECURSION);
    let mut out = Bounded::default();
    sym.structured_demangle(&mut out, &opts).ok()?;
    Some(out.0)
}

/// A string that refuses to grow past [`MAX_DEMANGLED`].
#[derive(Default)]
struct Bounded(String);

impl Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.0.len() + s.len() > MAX_DEMANGLED {
            return Err(fmt::Error);
        }
        self.0.push_str(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn cpp_rust_legacy_and_v0() {
        for (mangled, want) in [
            ("_ZN5space3fooEibc", "space::foo(int, bool, char)"),
            // gcc's clones keep their suffix.
            ("_ZL6squarei.cold", "square(int) [clone .cold]"),
            (
                "_ZN3std2rt10lang_start17h0123456789abcdefE",
                "std::rt::lang_start",
            ),
            ("_RNvCs1234_7mycrate3foo", "mycrate::foo"),
            (
                "_RNvMNtCs1234_7mycrate5shapeNtB2_6Square4area",
                "<mycrate::shape::Square>::area",
            ),
        ] {
            assert_eq!(demangle(mangled), want, "{mangled}");
        }
    }

    #[test]
    fn other_names_stay_as_they_are() {
        for name in [
            "main",
            "read_zero",
            "[anon]",
            "func_401000",
            "[.plt]",
            "_Z",
            "_Zjunk",
            "_R",
            "_ZN3foo",
            "",
        ] {
            assert!(
                matches!(demangle(name), std::borrow::Cow::Borrowed(n) if n == name),
                "{name}"
            );
        }
    }

    #[test]
    fn hostile_names_are_bounded() {
        // Deep nesting: refused by the recursion limit, not a stack overflow.
        let deep = format!("_Z1f{}i{}", "PFv".repeat(5000), "E".repeat(5000));
        assert_eq!(demangle(&deep), deep);
        // A valid name whose demangled form outgrows the bound is kept as the symbol;
        // the same name, shorter, demangles.
        let wide = |n: usize| format!("_Z1fP3Foo{}", "S0_".repeat(n));
        assert_eq!(demangle(&wide(2)), "f(Foo*, Foo*, Foo*)");
        assert_eq!(demangle(&wide(3000)), wide(3000));
        let long = format!("_ZN{}E", "3abc".repeat(10_000));
        assert_eq!(demangle(&long), long);
    }
}
