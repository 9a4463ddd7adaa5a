//! Reader of the exact taken-branch trace written by the Valgrind tool
//! `tests/tracer/cpitrace.c`.
//!
//! Format (little-endian): a 16-byte header — magic `CPITRC01`, `u32` version, `u32`
//! pid of the traced process — then 24-byte records `{from: u64, to: u64, n: u32,
//! kind: u16, aux: u16}`:
//!
//! | kind | meaning |
//! |------|---------|
//! | 1 branch | the thread ran `n` instructions from the previous record's `to` up to and including `from`, then continued at `to` (a taken transfer). `from = 0, n = 0`: the thread starts (or resumes after a signal) at `to`. |
//! | 2 thread | following records belong to OS thread `to` |
//! | 3 interrupt | the range ends after `n` instructions (the last at `from`); signal `aux` is delivered; the thread resumes at `to` later |
//! | 4 end | the thread's last range: `n` instructions, the last at `from` |
//! | 5 maps | `n` bytes of `/proc/PID/maps`-format text (the client's executable segments) follow, zero-padded to a multiple of 8 |
//! | 6 image | `n` bytes follow (padded as maps): the program Valgrind runs, as the command or `execve` named it |
//! | 7 fork | the process created child process `to`, which is not traced |
//!
//! The first record is an image record. A successful `execve` starts the tool again in
//! the same process: the stream goes on with a new header (same pid; its magic cannot
//! begin a record, as no record's `from` is that non-canonical address) and image
//! record, and the new program's records.
//! `rep` string instructions count once per execution, as hardware retires them.

use std::io::Read;

use crate::procmap::{ProcMapError, ProcessMaps};

/// The first 8 bytes of every trace.
pub(crate) const MAGIC: &[u8; 8] = b"CPITRC01";
/// The format version this reader reads (and `tests/tracer/cpitrace.c` writes).
pub(crate) const VERSION: u32 = 3;
const HEADER_LEN: usize = 16;
const RECORD_LEN: usize = 24;

const K_BRANCH: u16 = 1;
const K_THREAD: u16 = 2;
const K_INTERRUPT: u16 = 3;
const K_END: u16 = 4;
const K_MAPS: u16 = 5;
const K_IMAGE: u16 = 6;
const K_FORK: u16 = 7;

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading the stream failed.
    #[error("reading the trace")]
    Io(#[from] std::io::Error),
    /// The first 8 bytes are not `MAGIC` (they are shown).
    #[error("not a cpitrace trace (bad magic {0:02x?})")]
    BadMagic([u8; 8]),
    /// A trace of another format version than `VERSION`.
    #[error("trace version {found} is not supported (expected {VERSION})")]
    Version {
        /// The header's version.
        found: u32,
    },
    /// The stream ends inside the header or a record (the tracer died).
    #[error("trace truncated at byte {offset}: {what}")]
    Truncated {
        /// Where the cut part starts.
        offset: u64,
        /// What was being read ("header", "record" or "record text").
        what: &'static str,
    },
    /// A record kind this reader does not know.
    #[error("corrupt trace: unknown record kind {kind} at byte {offset}")]
    UnknownKind {
        /// The record's kind field.
        kind: u16,
        /// Where the record starts.
        offset: u64,
    },
    /// A maps record whose text is not `/proc/PID/maps` format.
    #[error("corrupt trace: maps record at byte {offset}")]
    Maps {
        /// Where the record starts.
        offset: u64,
        /// Why cpi-user/src/procmap/mod.rs rejected the text.
        #[source]
        source: ProcMapError,
    },
    /// A header in the middle of the trace (an exec) naming another process.
    #[error("corrupt trace: header at byte {offset} is of pid {found}, not {pid}")]
    ExecPid {
        /// Where the header starts.
        offset: u64,
        /// Its pid.
        found: u32,
        /// The trace's pid.
        pid: u32,
    },
    /// A maps record whose text is not UTF-8.
    #[error("corrupt trace: maps record at byte {offset} is not UTF-8")]
    MapsText {
        /// Where the record starts.
        offset: u64,
    },
}

/// One trace event.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// `n` instructions ran, the last at `from`; control continued at `to`.
    /// `from == 0 && n == 0`: the thread (re)starts at `to`.
    Branch {
        /// Address of the last instruction of the range (the branch), 0 at a (re)start.
        from: u64,
        /// Where control continued.
        to: u64,
        /// Instructions in the range, including `from`.
        n: u32,
    },
    /// Following events belong to this OS thread.
    Thread {
        /// Its kernel thread id.
        tid: u32,
    },
    /// The range ends after `n` instructions (the last at `from`); a signal interrupts
    /// the thread, which later resumes at `resume`.
    Interrupt {
        /// Address of the range's last instruction.
        from: u64,
        /// Where the thread resumes after the handler.
        resume: u64,
        /// Instructions in the range, including `from`.
        n: u32,
        /// The signal delivered.
        signal: u16,
    },
    /// The thread's last range.
    End {
        /// Address of the thread's last instruction.
        from: u64,
        /// Instructions in the range, including `from`.
        n: u32,
    },
    /// The client's executable mappings at this point.
    Maps(ProcessMaps),
    /// The program now running: the command at the start, and after each exec (which
    /// [`Event::Exec`] announces) the file `execve` named.
    Image {
        /// Its path, as given to Valgrind or `execve` (lossy UTF-8).
        path: String,
    },
    /// A successful exec replaced the program: every thread and mapping is gone, and an
    /// [`Event::Image`] follows.
    Exec,
    /// The process created a child process, which is not traced.
    Fork {
        /// The child's pid.
        child: u32,
    },
}

/// Streaming reader; buffers in large blocks so a pipe from a running Valgrind is read
/// at memory speed.
pub struct TraceReader<R: Read> {
    inner: R,
    buf: Vec<u8>,
    pos: usize,
    len: usize,
    /// Bytes consumed before `buf[0]`.
    base: u64,
    pid: u32,
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the header.
    pub fn new(inner: R) -> Result<Self, TraceError> {
        let mut r = TraceReader {
            inner,
            buf: vec![0; 1 << 20],
            pos: 0,
            len: 0,
            base: 0,
            pid: 0,
        };
        r.pid = r.header()?;
        Ok(r)
    }

    /// Reads and checks a header; returns its pid.
    fn header(&mut self) -> Result<u32, TraceError> {
        if !self.fill(HEADER_LEN)? {
            return Err(TraceError::Truncated {
                offset: self.offset(),
                what: "header",
            });
        }
        let h = &self.buf[self.pos..self.pos + HEADER_LEN];
        let magic: [u8; 8] = h[..8].try_into().expect("8 bytes");
        if &magic != MAGIC {
            return Err(TraceError::BadMagic(magic));
        }
        let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(TraceError::Version { found: version });
        }
        let pid = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes"));
        self.pos += HEADER_LEN;
        Ok(pid)
    }

    /// The `n` bytes of text after a record (zero-padded to 8), consumed.
    fn text(&mut self, n: u32) -> Result<&[u8], TraceError> {
        let len = n as usize;
        let padded = len.div_ceil(8) * 8;
        if !self.fill(padded)? {
            return Err(TraceError::Truncated {
                offset: self.offset(),
                what: "record text",
            });
        }
        self.pos += padded;
        Ok(&self.buf[self.pos - padded..self.pos - padded + len])
    }

    /// Process id of the traced program (Valgrind runs it in its own process).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Byte offset of the next unread byte.
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Ensures `need` bytes are buffered; false at a clean end of input with nothing
    /// buffered; `Truncated` errors are the caller's (it knows what it was reading).
    fn fill(&mut self, need: usize) -> Result<bool, TraceError> {
        if self.len - self.pos >= need {
            return Ok(true);
        }
        self.buf.copy_within(self.pos..self.len, 0);
        self.base += self.pos as u64;
        self.len -= self.pos;
        self.pos = 0;
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
        while self.len < need {
            match self.inner.read(&mut self.buf[self.len..]) {
                Ok(0) => return Ok(false),
                Ok(k) => self.len += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(true)
    }

    /// The next record if it is a taken branch (nearly all of a trace), consumed, as
    /// `(from, to, n)`; else `None`, and [`Self::next`] reads it.
    ///
    /// Inline and enum-free so the replay loop keeps the fields in registers: an
    /// [`Event`] from [`Self::next`] goes through memory, and reloading it stalls on
    /// store forwarding (`simulate` 1.3× slower when a codegen-unit split stopped
    /// inlining `next`).
    #[inline(always)]
    pub(crate) fn next_branch(&mut self) -> Option<(u64, u64, u32)> {
        let (from, to, n, kind, _) = decode(self.buf[self.pos..self.len].first_chunk()?);
        // A header's magic is no canonical address, so never a record's `from`.
        if kind != K_BRANCH || from == u64::from_le_bytes(*MAGIC) {
            return None;
        }
        self.pos += RECORD_LEN;
        Some((from, to, n))
    }

    /// The next event; `None` at the end of the trace.
    #[allow(clippy::should_implement_trait)] // fallible: not an Iterator
    pub fn next(&mut self) -> Result<Option<Event>, TraceError> {
        if !self.fill(RECORD_LEN)? {
            if self.len == self.pos {
                return Ok(None);
            }
            return Err(TraceError::Truncated {
                offset: self.offset(),
                what: "record",
            });
        }
        let offset = self.offset();
        if &self.buf[self.pos..self.pos + 8] == MAGIC {
            let found = self.header()?;
            if found != self.pid {
                return Err(TraceError::ExecPid {
                    offset,
                    found,
                    pid: self.pid,
                });
            }
            return Ok(Some(Event::Exec));
        }
        let r = self.buf[self.pos..]
            .first_chunk::<RECORD_LEN>()
            .expect("filled");
        let (from, to, n, kind, aux) = decode(r);
        self.pos += RECORD_LEN;
        Ok(Some(match kind {
            K_BRANCH => Event::Branch { from, to, n },
            K_THREAD => Event::Thread { tid: to as u32 },
            K_INTERRUPT => Event::Interrupt {
                from,
                resume: to,
                n,
                signal: aux,
            },
            K_END => Event::End { from, n },
            K_MAPS => {
                let text = std::str::from_utf8(self.text(n)?)
                    .map_err(|_| TraceError::MapsText { offset })?;
                let maps = ProcessMaps::parse(text)
                    .map_err(|source| TraceError::Maps { offset, source })?;
                Event::Maps(maps)
            }
            K_IMAGE => Event::Image {
                path: String::from_utf8_lossy(self.text(n)?).into_owned(),
            },
            K_FORK => Event::Fork { child: to as u32 },
            kind => return Err(TraceError::UnknownKind { kind, offset }),
        }))
    }
}

/// A record's fields: `(from, to, n, kind, aux)`.
#[inline(always)]
fn decode(r: &[u8; RECORD_LEN]) -> (u64, u64, u32, u16, u16) {
    let from = u64::from_le_bytes(r[0..8].try_into().expect("8 bytes"));
    let to = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
    let n = u32::from_le_bytes(r[16..20].try_into().expect("4 bytes"));
    let kind = u16::from_le_bytes(r[20..22].try_into().expect("2 bytes"));
    let aux = u16::from_le_bytes(r[22..24].try_into().expect("2 bytes"));
    (from, to, n, kind, aux)
}

/// Writes traces in the tool's format, for the tests below.
#[cfg(test)]
mod write {
    /// The header for `pid`.
    pub fn header(pid: u32) -> Vec<u8> {
        let mut v = super::MAGIC.to_vec();
        v.extend_from_slice(&super::VERSION.to_le_bytes());
        v.extend_from_slice(&pid.to_le_bytes());
        v
    }

    /// Appends one record.
    pub fn record(out: &mut Vec<u8>, from: u64, to: u64, n: u32, kind: u16, aux: u16) {
        out.extend_from_slice(&from.to_le_bytes());
        out.extend_from_slice(&to.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&aux.to_le_bytes());
    }

    pub fn branch(out: &mut Vec<u8>, from: u64, to: u64, n: u32) {
        record(out, from, to, n, super::K_BRANCH, 0);
    }

    pub fn thread(out: &mut Vec<u8>, tid: u32) {
        record(out, 0, tid as u64, 0, super::K_THREAD, 0);
    }

    pub fn end(out: &mut Vec<u8>, from: u64, n: u32) {
        record(out, from, 0, n, super::K_END, 0);
    }

    fn text(out: &mut Vec<u8>, kind: u16, text: &str) {
        record(out, 0, 0, text.len() as u32, kind, 0);
        out.extend_from_slice(text.as_bytes());
        out.resize(out.len().div_ceil(8) * 8, 0);
    }

    pub fn maps(out: &mut Vec<u8>, maps: &str) {
        text(out, super::K_MAPS, maps);
    }

    pub fn image(out: &mut Vec<u8>, path: &str) {
        text(out, super::K_IMAGE, path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut t = write::header(42);
        write::maps(&mut t, "108000-10a000 r-xp 00001000 00:00 1 /bin/x\n");
        write::thread(&mut t, 42);
        write::branch(&mut t, 0, 0x108000, 0);
        write::branch(&mut t, 0x108010, 0x108100, 5);
        write::record(&mut t, 0x108104, 0x108108, 2, K_INTERRUPT, 11);
        write::end(&mut t, 0x108120, 3);
        t
    }

    #[test]
    fn reads_every_kind() {
        let t = sample();
        let mut r = TraceReader::new(&t[..]).unwrap();
        assert_eq!(r.pid(), 42);
        let mut ev = Vec::new();
        while let Some(e) = r.next().unwrap() {
            ev.push(e);
        }
        assert_eq!(ev.len(), 6);
        match &ev[0] {
            Event::Maps(m) => assert_eq!(m.mappings[0].start, 0x108000),
            e => panic!("{e:?}"),
        }
        assert_eq!(ev[1], Event::Thread { tid: 42 });
        assert_eq!(
            ev[3],
            Event::Branch {
                from: 0x108010,
                to: 0x108100,
                n: 5
            }
        );
        assert_eq!(
            ev[4],
            Event::Interrupt {
                from: 0x108104,
                resume: 0x108108,
                n: 2,
                signal: 11
            }
        );
        assert_eq!(
            ev[5],
            Event::End {
                from: 0x108120,
                n: 3
            }
        );
    }

    #[test]
    fn next_branch_takes_only_branches_and_next_reads_the_rest() {
        let mut t = sample();
        t.extend_from_slice(&write::header(42));
        // Byte 4 of this `from` is where a header's kind would be read: 1, a branch.
        write::branch(&mut t, 0x1_0000_0000, 0x108000, 1);
        let read = |fast: bool| {
            let mut r = TraceReader::new(&t[..]).unwrap();
            let mut ev = Vec::new();
            loop {
                if let Some((from, to, n)) = fast.then(|| r.next_branch()).flatten() {
                    ev.push(Event::Branch { from, to, n });
                } else if let Some(e) = r.next().unwrap() {
                    ev.push(e);
                } else {
                    return ev;
                }
            }
        };
        let plain = read(false);
        assert_eq!(plain.len(), 8);
        assert_eq!(plain[6], Event::Exec);
        assert_eq!(read(true), plain);
    }

    #[test]
    fn an_exec_goes_on_in_the_same_stream() {
        let mut t = write::header(42);
        write::image(&mut t, "sh");
        write::thread(&mut t, 42);
        write::record(&mut t, 0, 43, 0, K_FORK, 0);
        write::end(&mut t, 0x108010, 4);
        t.extend_from_slice(&write::header(42));
        write::image(&mut t, "/bin/prog-é");
        write::thread(&mut t, 42);
        let mut r = TraceReader::new(&t[..]).unwrap();
        let mut ev = Vec::new();
        while let Some(e) = r.next().unwrap() {
            ev.push(e);
        }
        assert_eq!(
            ev,
            [
                Event::Image { path: "sh".into() },
                Event::Thread { tid: 42 },
                Event::Fork { child: 43 },
                Event::End {
                    from: 0x108010,
                    n: 4
                },
                Event::Exec,
                Event::Image {
                    path: "/bin/prog-é".into()
                },
                Event::Thread { tid: 42 },
            ]
        );
        // Another process's header cannot join this stream.
        let mut bad = write::header(42);
        bad.extend_from_slice(&write::header(7));
        write::thread(&mut bad, 7);
        let mut r = TraceReader::new(&bad[..]).unwrap();
        assert!(matches!(
            r.next().unwrap_err(),
            TraceError::ExecPid {
                offset: 16,
                found: 7,
                pid: 42
            }
        ));
    }

    #[test]
    fn truncation_and_corruption_are_typed_errors() {
        let t = sample();
        // Cut inside the last record.
        let mut r = TraceReader::new(&t[..t.len() - 5]).unwrap();
        let err = loop {
            match r.next() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("truncation not noticed"),
                Err(e) => break e,
            }
        };
        assert!(
            matches!(err, TraceError::Truncated { what: "record", .. }),
            "{err}"
        );
        // Cut inside the maps text.
        let mut r = TraceReader::new(&t[..50]).unwrap();
        assert!(matches!(
            r.next().unwrap_err(),
            TraceError::Truncated {
                what: "record text",
                ..
            }
        ));
        // Header too short, wrong magic, unknown kind.
        assert!(matches!(
            TraceReader::new(&t[..10]).err().unwrap(),
            TraceError::Truncated { what: "header", .. }
        ));
        let mut bad = t.clone();
        bad[0] = b'X';
        assert!(matches!(
            TraceReader::new(&bad[..]).err().unwrap(),
            TraceError::BadMagic(_)
        ));
        let mut bad = write::header(1);
        write::record(&mut bad, 1, 2, 3, 99, 0);
        let mut r = TraceReader::new(&bad[..]).unwrap();
        assert!(matches!(
            r.next().unwrap_err(),
            TraceError::UnknownKind {
                kind: 99,
                offset: 16
            }
        ));
    }
}
