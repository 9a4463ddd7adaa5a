//! cpi-bpf's library: every pipeline. The `cpi-bpf` binary (its own package) is a thin
//! CLI over it and over the `cpi-agent` crate, which builds the always-on agent on it.
//!
//! Stages (docs/METHOD.md, "Architecture"): [`collect`] brings wire samples home from the kernel, [`sim`]
//! produces the same samples from an exact execution trace, [`profile`] aggregates them
//! per process and turns them into instruction/block/edge counts and CPI using
//! [`procmap`] and [`binary`], [`import`] reads recordings made elsewhere (`perf.data`,
//! `perf script` text) into the same samples, and [`report`] renders and exports the result.

#![warn(missing_docs)]

pub mod binary;
pub mod collect;
pub mod fsafe;
pub mod import;
pub mod procmap;
pub mod profile;
pub mod progress;
pub mod report;
pub mod sim;
pub(crate) mod unwind;

/// `e` and its causes in one line, `e: cause: cause`: each error's message says what
/// failed and leaves its cause to [`std::error::Error::source`], so `{e}` alone drops the
/// cause. Use this wherever the library logs or stores an error as text.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        line += ": ";
        line += &c.to_string();
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use std::error::Error;
    use std::io;
    use std::path::PathBuf;

    /// Fails where a message repeats its cause's: the cause would be printed twice.
    fn says_each_cause_once(e: &dyn Error) -> String {
        let mut link: Option<&dyn Error> = Some(e);
        while let Some(l) = link {
            if let Some(cause) = l.source() {
                let (msg, said) = (l.to_string(), cause.to_string());
                assert!(!msg.contains(&said), "{msg:?} repeats its source {said:?}");
            }
            link = l.source();
        }
        super::chain(e)
    }

    fn enoent() -> io::Error {
        io::Error::from_raw_os_error(libc::ENOENT)
    }

    #[test]
    fn chain_prints_each_cause_once() {
        use crate::sim::{trace::TraceError, SimError};
        let fifo = SimError::Fifo(PathBuf::from("/t/fifo"), enoent());
        assert_eq!(
            says_each_cause_once(&fifo),
            "trace FIFO /t/fifo: No such file or directory (os error 2)"
        );
        let spawn = SimError::Spawn(enoent());
        assert_eq!(
            says_each_cause_once(&spawn),
            "starting valgrind (apt-get install valgrind): No such file or directory (os error 2)"
        );
        let maps = SimError::Trace(TraceError::Maps {
            offset: 40,
            source: crate::procmap::ProcMapError::Malformed {
                line: 1,
                text: "x".into(),
            },
        });
        assert_eq!(
            says_each_cause_once(&maps),
            "corrupt trace: maps record at byte 40: line 1 of a maps file is malformed: \"x\""
        );
        let bug = minijinja::Error::new(minijinja::ErrorKind::UndefinedError, "no such field");
        let html = crate::report::html::HtmlError::Template(bug);
        let line = says_each_cause_once(&html);
        assert!(line.starts_with("rendering the HTML page: "), "{line}");
        assert_eq!(line.matches("no such field").count(), 1, "{line}");
        // A leaf whose cause is part of its message is not also its source.
        let open = crate::fsafe::OpenError::Io {
            path: PathBuf::from("/t/f"),
            cause: enoent(),
        };
        assert_eq!(
            says_each_cause_once(&open),
            "/t/f: No such file or directory (os error 2)"
        );
    }
}
