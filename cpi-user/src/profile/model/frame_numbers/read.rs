//! The reading side of [`super`]: a path's frames as a profile file lists them, each a
//! number into the file's frame table or a frame written whole. A number is held as a
//! frame whose `address` is the number (names empty) and marked in [`collect`]'s list;
//! the reader (cpi-user/src/report/file.rs) writes it out once the table, which follows
//! the paths, is read.

use std::cell::RefCell;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::profile::model::StackFrame;

thread_local! {
    /// While a file is read ([`collect`]): for each frame read, in order, whether it
    /// was a number; and the most frames the file may list.
    static READ: RefCell<Option<(Vec<bool>, usize)>> = const { RefCell::new(None) };
}

/// Runs `read` (a profile file's deserialisation) counting its frames, at most
/// `max_frames` (more is an error of the read): for each frame read, in order,
/// whether it was a number into the file's frame table.
pub(crate) fn collect<R>(max_frames: usize, read: impl FnOnce() -> R) -> (R, Vec<bool>) {
    struct TakeBack;
    impl Drop for TakeBack {
        fn drop(&mut self) {
            READ.with(|r| *r.borrow_mut() = None);
        }
    }
    READ.with(|r| *r.borrow_mut() = Some((Vec::new(), max_frames)));
    let take_back = TakeBack;
    let read = read();
    let numbered = READ.with(|r| r.borrow_mut().take()).map(|(n, _)| n);
    drop(take_back);
    (read, numbered.unwrap_or_default())
}

/// Notes one frame read ([`collect`]); an error past the bound, or for a number
/// read outside a file.
fn note<E: de::Error>(numbered: bool) -> Result<(), E> {
    READ.with(|r| match r.borrow_mut().as_mut() {
        Some((read, max)) if read.len() >= *max => Err(E::custom(format_args!(
            "the call paths list more than {max} frames"
        ))),
        Some((read, _)) => {
            read.push(numbered);
            Ok(())
        }
        None if numbered => Err(E::custom("a frame number outside a profile file")),
        None => Ok(()),
    })
}

/// How many frames have been read so far ([`rewind`]'s mark); 0 outside a file.
pub(crate) fn mark() -> usize {
    READ.with(|r| r.borrow().as_ref().map_or(0, |(read, _)| read.len()))
}

/// Forgets the frames read since `mark` (a process left out whole).
pub(crate) fn rewind(mark: usize) {
    READ.with(|r| {
        if let Some((read, _)) = r.borrow_mut().as_mut() {
            read.truncate(mark);
        }
    });
}

/// A path's frames: each a number into the file's frame table, or whole.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<StackFrame>, D::Error> {
    struct Frames;
    impl<'de> Visitor<'de> for Frames {
        type Value = Vec<StackFrame>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of frames")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut frames = Vec::new();
            while let Some(Frame(f, numbered)) = seq.next_element()? {
                note::<A::Error>(numbered)?;
                frames.push(f);
            }
            Ok(frames)
        }
    }
    d.deserialize_seq(Frames)
}

/// One frame as read, and whether it was a number.
struct Frame(StackFrame, bool);

impl<'de> Deserialize<'de> for Frame {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Frame, D::Error> {
        struct OneFrame;
        impl<'de> Visitor<'de> for OneFrame {
            type Value = Frame;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a frame number or a frame")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Frame, E> {
                let f = StackFrame {
                    function: String::new(),
                    binary: String::new(),
                    address: n,
                };
                Ok(Frame(f, true))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Frame, A::Error> {
                let f = StackFrame::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Frame(f, false))
            }
        }
        d.deserialize_any(OneFrame)
    }
}
