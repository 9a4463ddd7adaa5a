//! Progress of long work (tracing, analysis, imports, store reads), told to whoever
//! installed a [`Reporter`]: the binary draws it as a bar on a terminal
//! (cpi-bpf/src/progress.rs). Like the `log` facade, the pipelines need no
//! extra argument, and without a reporter (the agent, the tests) a stage costs one load.

use std::sync::OnceLock;

/// What a stage counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes read.
    Bytes,
    /// Things, named in the plural (`functions`, `windows`, `branches`).
    Count(&'static str),
}

/// Shows stages as they run. One stage at a time: a new one replaces the last.
pub trait Reporter: Send + Sync {
    /// A stage begins: what it does, its size when known, and what it counts.
    fn begin(&self, what: &str, total: Option<u64>, unit: Unit);
    /// `done` units of the current stage are done.
    fn update(&self, done: u64);
    /// The current stage is over.
    fn end(&self);
}

static REPORTER: OnceLock<Box<dyn Reporter>> = OnceLock::new();

/// Sends every later stage to `r`; false when a reporter was already installed.
pub fn install(r: Box<dyn Reporter>) -> bool {
    REPORTER.set(r).is_ok()
}

/// A running stage, ended when dropped (an error's `?` included).
#[must_use = "the stage ends when this is dropped"]
pub struct Stage {
    to: Option<&'static dyn Reporter>,
}

/// Begins a stage: `what` it does (`analysing`), `total` units when known.
pub fn stage(what: &str, total: Option<u64>, unit: Unit) -> Stage {
    let to = REPORTER.get().map(|r| &**r);
    if let Some(r) = to {
        r.begin(what, total, unit);
    }
    Stage { to }
}

impl Stage {
    /// `done` units are done.
    pub fn update(&self, done: u64) {
        if let Some(r) = self.to {
            r.update(done);
        }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        if let Some(r) = self.to {
            r.end();
        }
    }
}

/// Bytes read between updates of a [`Reading`] stage.
const READ_STEP: u64 = 1 << 20;

/// A reader shown as a stage of bytes read (a recording being imported); its position
/// after a seek counts as read.
pub struct Reading<R> {
    inner: R,
    pos: u64,
    shown: u64,
    stage: Stage,
}

impl<R> Reading<R> {
    /// Reads `inner`, `total` bytes long when known, shown as `what`.
    pub fn new(inner: R, what: &str, total: Option<u64>) -> Self {
        Reading {
            inner,
            pos: 0,
            shown: 0,
            stage: stage(what, total, Unit::Bytes),
        }
    }

    fn advance(&mut self, pos: u64) {
        self.pos = pos;
        if self.pos.abs_diff(self.shown) >= READ_STEP {
            self.shown = self.pos;
            self.stage.update(self.pos);
        }
    }
}

impl<R: std::io::Read> std::io::Read for Reading<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.advance(self.pos.saturating_add(n as u64));
        Ok(n)
    }
}

impl<R: std::io::BufRead> std::io::BufRead for Reading<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amt: usize) {
        self.inner.consume(amt);
        self.advance(self.pos.saturating_add(amt as u64));
    }
}

impl<R: std::io::Seek> std::io::Seek for Reading<R> {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let pos = self.inner.seek(to)?;
        self.advance(pos);
        Ok(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Read, Seek, SeekFrom};

    /// A reading stage passes every byte through unchanged and keeps its position
    /// across reads, buffered reads and seeks.
    #[test]
    fn reading_passes_bytes_through_and_tracks_its_position() {
        let data: Vec<u8> = (0..=255u8).cycle().take(3 << 20).collect();
        let mut r = Reading::new(std::io::Cursor::new(data.clone()), "t", Some(3 << 20));
        let mut head = [0u8; 10];
        r.read_exact(&mut head).unwrap();
        assert_eq!(head[..], data[..10]);
        assert_eq!(r.pos, 10);
        r.seek(SeekFrom::Start(2 << 20)).unwrap();
        assert_eq!((r.pos, r.shown), (2 << 20, 2 << 20));
        let got = r.fill_buf().unwrap().len();
        r.consume(got);
        assert_eq!(r.pos, (2 << 20) + got as u64);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest[..], data[(2 << 20) + got..]);
        assert_eq!(r.pos, 3 << 20);
    }
}
