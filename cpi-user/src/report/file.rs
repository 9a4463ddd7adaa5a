//! The profile file: the versioned JSON form of a [`Profile`] (`--output FILE`), read
//! back by `cpi-bpf report`, plain or gzip'd (an agent's window, cpi-agent/src/store.rs). Reading never panics: a truncated, corrupt, foreign or
//! newer file is one [`ProfileFileError`]. What is read is bounded: at most
//! [`MAX_PROFILE_BYTES`] (`report /dev/zero` stops there), and JSON nesting by
//! serde_json's recursion limit (128), so no input grows memory without end.
//!
//! Format 2 (what is written now) is format 1 with a frame
//! table, as pprof has function and location tables: `stack_functions` holds each
//! distinct function of the call paths once (`name`, `binary`), `stack_frames` each
//! distinct frame once (`function`: its number in `stack_functions`, `address`), and a
//! path's `frames` lists frame numbers. Format 1 wrote every frame whole: on a build host
//! three quarters of a window's JSON were frames repeating their function and binary
//! (BENCHMARKS.md, "The store's format"). Both read to the same [`Profile`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::fsafe::{budget_in_place, MAX_NAME_BYTES};
use crate::profile::model::bounds::{self, Bounds};
use crate::profile::model::{frame_numbers, Profile, StackFrame, PROFILE_FORMAT_VERSION};

/// Why a profile file could not be written or read back; each is one line naming the
/// file (`origin`), which `cpi-bpf report` prints as is.
#[derive(Debug, thiserror::Error)]
pub enum ProfileFileError {
    /// The file could not be opened, or was a FIFO no one wrote to
    /// (cpi-user/src/fsafe/mod.rs, `open_input`).
    #[error(transparent)]
    Open(#[from] crate::fsafe::OpenError),
    /// Opening or reading the file (or stream) failed.
    // Not a `#[source]`: the message already carries the cause, once.
    #[error("reading profile {}: {error}", .path.display())]
    Io {
        /// The file, or the stream's name for [`read_stream`].
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// The JSON ends early (e.g. a copy cut short).
    #[error("profile {origin} is truncated (ends at line {line}, column {column})")]
    Truncated {
        /// The file's name as given.
        origin: String,
        /// Where the text ends, 1-based.
        line: usize,
        /// Column of that end, 1-based.
        column: usize,
    },
    /// The bytes are not JSON at all.
    #[error("profile {origin} is not valid JSON: {detail}")]
    NotJson {
        /// The file's name as given.
        origin: String,
        /// serde_json's message (with its line and column).
        detail: String,
    },
    /// JSON without a `format_version`: some other program's file.
    #[error("{origin} is not a cpi-bpf profile (no format_version field)")]
    NotAProfile {
        /// The file's name as given.
        origin: String,
    },
    /// Written by a newer cpi-bpf: refused rather than misread.
    #[error(
        "profile {origin} has format version {found}, newer than this cpi-bpf reads \
         ({supported}); use a newer cpi-bpf"
    )]
    FutureVersion {
        /// The file's name as given.
        origin: String,
        /// The file's `format_version`.
        found: u64,
        /// The newest this build reads ([`PROFILE_FORMAT_VERSION`]).
        supported: u32,
    },
    /// A known version whose content does not fit the profile model.
    #[error("profile {origin} is corrupt: {detail}")]
    Corrupt {
        /// The file's name as given.
        origin: String,
        /// What does not fit (serde_json's message, or the bad version).
        detail: String,
    },
    /// Longer than [`MAX_PROFILE_BYTES`]; reading stopped there.
    #[error(
        "profile {origin} is larger than {} MiB: not a profile this cpi-bpf reads",
        MAX_PROFILE_BYTES >> 20
    )]
    TooLarge {
        /// The file's name as given.
        origin: String,
    },
    /// Writing: the profile cannot be serialised or would not read back ([`to_json`]).
    #[error("serialising the profile: {0}")]
    Serialise(String),
}

/// The file's text: pretty JSON with a trailing newline ([`write_json`] into memory).
pub fn to_json(p: &Profile) -> Result<String, ProfileFileError> {
    let mut text = Vec::new();
    write_json(p, &mut text).map_err(|e| ProfileFileError::Serialise(e.to_string()))?;
    String::from_utf8(text).map_err(|e| ProfileFileError::Serialise(e.to_string()))
}

/// Writes the file's text (pretty JSON, a trailing newline) to `w` as it is serialised,
/// buffered: the whole text is never in memory. A profile that would not read back is
/// refused before a byte is written: serde_json writes a non-finite f64 as `null`,
/// which the reader rejects.
pub fn write_json(p: &Profile, w: impl Write) -> std::io::Result<()> {
    write_json_as(p, w, true)
}

/// [`write_json`] without indentation, for files only programs read (the agent's store:
/// a window with stacks of busy processes was 26 MB of pretty JSON, 18 MB compact, and
/// serialising and compressing it was a sixth of the agent's CPU; BENCHMARKS.md, "Agent
/// CPU per stack sample").
pub fn write_json_compact(p: &Profile, w: impl Write) -> std::io::Result<()> {
    write_json_as(p, w, false)
}

fn write_json_as(p: &Profile, w: impl Write, pretty: bool) -> std::io::Result<()> {
    let invalid = |e: serde_json::Error| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("serialising the profile: {e}"),
        )
    };
    p.serialize(FiniteCheck).map_err(invalid)?;
    let (stack_functions, stack_frames, numbers) = frame_table(p);
    let text = FileText {
        profile: p,
        stack_functions,
        stack_frames,
    };
    let mut w = BufWriter::new(w);
    let written = frame_numbers::lend(numbers, || {
        if pretty {
            serde_json::to_writer_pretty(&mut w, &text)
        } else {
            serde_json::to_writer(&mut w, &text)
        }
    });
    written.map_err(|e| match e.io_error_kind() {
        Some(_) => std::io::Error::from(e),
        None => invalid(e),
    })?;
    w.write_all(b"\n")?;
    w.flush()
}

/// What a profile file holds: the profile, its call paths' frames as numbers
/// ([`frame_numbers`]) into the frame table that follows it (the module's doc).
#[derive(Serialize)]
struct FileText<'a> {
    #[serde(flatten)]
    profile: &'a Profile,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stack_functions: Vec<TableFunction<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stack_frames: Vec<TableFrame>,
}

/// A function of the frame table.
#[derive(Serialize, Deserialize)]
struct TableFunction<'a> {
    name: Cow<'a, str>,
    binary: Cow<'a, str>,
}

/// A frame of the frame table: its function's number, and the address.
#[derive(Serialize, Deserialize)]
struct TableFrame {
    function: u32,
    address: u64,
}

/// The frame table of `p`, and every path's frames as numbers into it, in the order
/// the paths are written. Each frame is hashed once, with a fast seeded hasher: with
/// std's SipHash and a second lookup per frame for its function, numbering a build
/// host's window cost as much CPU as writing it (BENCHMARKS.md, "The store's format").
fn frame_table(p: &Profile) -> (Vec<TableFunction<'_>>, Vec<TableFrame>, Vec<u32>) {
    type Numbers<K> = HashMap<K, u32, foldhash::fast::RandomState>;
    let mut function_numbers: Numbers<(&str, &str)> = Numbers::default();
    let mut frame_numbers: Numbers<&StackFrame> = Numbers::default();
    let (mut functions, mut frames, mut numbers) = (Vec::new(), Vec::new(), Vec::new());
    for f in p
        .processes
        .iter()
        .flat_map(|x| &x.stacks)
        .flat_map(|s| &s.frames)
    {
        let next = frames.len() as u32;
        let number = *frame_numbers.entry(f).or_insert_with(|| {
            let next_function = functions.len() as u32;
            let function = *function_numbers
                .entry((&f.function, &f.binary))
                .or_insert_with(|| {
                    functions.push(TableFunction {
                        name: Cow::Borrowed(&f.function),
                        binary: Cow::Borrowed(&f.binary),
                    });
                    next_function
                });
            frames.push(TableFrame {
                function,
                address: f.address,
            });
            next
        });
        numbers.push(number);
    }
    (functions, frames, numbers)
}

/// A serializer that writes nothing and fails at the first non-finite float
/// ([`write_json`]'s check, without a copy of the text).
struct FiniteCheck;

type Checked = Result<(), serde_json::Error>;

/// The methods of [`FiniteCheck`] that see nothing to check.
macro_rules! nothing_to_check {
    ($($method:ident($($arg:ty),*);)*) => {
        $(fn $method(self, $(_: $arg),*) -> Checked { Ok(()) })*
    };
}

/// The methods of [`FiniteCheck`] that start a sequence, map or struct: its parts are
/// checked one by one (`check_parts!`).
macro_rules! compound {
    ($($method:ident($($arg:ty),*);)*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<Self, serde_json::Error> { Ok(self) })*
    };
}

/// [`FiniteCheck`] for the parts of sequences, maps and structs: each element checked.
macro_rules! check_parts {
    ($($trait:ident: $method:ident($($key:ty)?);)*) => {$(
        impl serde::ser::$trait for FiniteCheck {
            type Ok = ();
            type Error = serde_json::Error;
            fn $method<T: ?Sized + Serialize>(&mut self, $(_: $key,)? v: &T) -> Checked {
                v.serialize(FiniteCheck)
            }
            fn end(self) -> Checked {
                Ok(())
            }
        }
    )*};
}

check_parts! {
    SerializeSeq: serialize_element();
    SerializeTuple: serialize_element();
    SerializeTupleStruct: serialize_field();
    SerializeTupleVariant: serialize_field();
    SerializeStruct: serialize_field(&'static str);
    SerializeStructVariant: serialize_field(&'static str);
}

impl serde::ser::SerializeMap for FiniteCheck {
    type Ok = ();
    type Error = serde_json::Error;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, k: &T) -> Checked {
        k.serialize(FiniteCheck)
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, v: &T) -> Checked {
        v.serialize(FiniteCheck)
    }
    fn end(self) -> Checked {
        Ok(())
    }
}

impl serde::Serializer for FiniteCheck {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    nothing_to_check! {
        serialize_bool(bool);
        serialize_i8(i8);
        serialize_i16(i16);
        serialize_i32(i32);
        serialize_i64(i64);
        serialize_u8(u8);
        serialize_u16(u16);
        serialize_u32(u32);
        serialize_u64(u64);
        serialize_char(char);
        serialize_str(&str);
        serialize_bytes(&[u8]);
        serialize_none();
        serialize_unit();
        serialize_unit_struct(&'static str);
        serialize_unit_variant(&'static str, u32, &'static str);
    }

    fn serialize_f32(self, v: f32) -> Checked {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Checked {
        if v.is_finite() {
            Ok(())
        } else {
            Err(serde::ser::Error::custom(format!(
                "{v} would be written as null and not read back"
            )))
        }
    }
    fn serialize_some<T: ?Sized + Serialize>(self, v: &T) -> Checked {
        v.serialize(self)
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(self, _: &'static str, v: &T) -> Checked {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        v: &T,
    ) -> Checked {
        v.serialize(self)
    }
    compound! {
        serialize_seq(Option<usize>);
        serialize_tuple(usize);
        serialize_tuple_struct(&'static str, usize);
        serialize_tuple_variant(&'static str, u32, &'static str, usize);
        serialize_map(Option<usize>);
        serialize_struct(&'static str, usize);
        serialize_struct_variant(&'static str, u32, &'static str, usize);
    }
}

/// As perf keeps `perf.data.old`: an existing regular file at `path` is renamed
/// `path.old` (replacing an older one) once the new output is written, just before it
/// takes the name, so a run never overwrites the last one. Devices, pipes and missing files are left alone.
fn keep_old(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => {
            let mut old = path.as_os_str().to_owned();
            old.push(".old");
            std::fs::rename(path, old)
        }
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The largest profile file read (its parsed form takes a few times this in memory).
pub const MAX_PROFILE_BYTES: u64 = 256 << 20;

/// Reads a profile file (a pipe with a writer too; a FIFO without one is an error
/// within [`crate::fsafe::FIFO_WAIT`]).
pub fn read(path: &Path) -> Result<Profile, ProfileFileError> {
    let f = crate::fsafe::open_input(path, crate::fsafe::FIFO_WAIT)?;
    read_stream(f, &path.display().to_string())
}

/// Reads a profile from `r` (standard input, a pipe), at most [`MAX_PROFILE_BYTES`];
/// `origin` names it in errors.
pub fn read_stream(r: impl Read, origin: &str) -> Result<Profile, ProfileFileError> {
    read_from(r, origin).map_err(|e| match e {
        ReadError::Io(error) => ProfileFileError::Io {
            path: origin.into(),
            error,
        },
        ReadError::Profile(e) => e,
    })
}

enum ReadError {
    Io(std::io::Error),
    Profile(ProfileFileError),
}

fn read_from(r: impl Read, origin: &str) -> Result<Profile, ReadError> {
    let too_large = || {
        ReadError::Profile(ProfileFileError::TooLarge {
            origin: origin.to_string(),
        })
    };
    let mut r = BufReader::new(r.take(MAX_PROFILE_BYTES + 1));
    // A gzip'd profile (an agent's window, `w-….json.gz`): the same bound after
    // decompression.
    let gzip = r
        .fill_buf()
        .map_err(ReadError::Io)?
        .starts_with(&[0x1f, 0x8b]);
    let mut text: Box<dyn Read> = if gzip {
        Box::new(flate2::bufread::GzDecoder::new(&mut r).take(MAX_PROFILE_BYTES + 1))
    } else {
        Box::new(&mut r)
    };
    let mut counted = Counted {
        inner: &mut text,
        bytes: 0,
    };
    let read = from_json(
        serde_json::Deserializer::from_reader(BufReader::new(&mut counted)),
        origin,
    );
    // Either bound reached (of the file or of its decompressed text): whatever the
    // parser made of the cut, the file is too large.
    if counted.bytes > MAX_PROFILE_BYTES {
        return Err(too_large());
    }
    drop(text);
    if r.get_ref().limit() == 0 {
        return Err(too_large());
    }
    read
}

/// Counts the bytes read through it (the decompressed length of a gzip'd profile).
struct Counted<R> {
    inner: R,
    bytes: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

/// A JSON syntax error: the text ends early, or is not JSON.
fn json_error(e: serde_json::Error, origin: &str) -> ProfileFileError {
    if e.is_eof() {
        ProfileFileError::Truncated {
            origin: origin.to_string(),
            line: e.line(),
            column: e.column(),
        }
    } else {
        ProfileFileError::NotJson {
            origin: origin.to_string(),
            detail: e.to_string(),
        }
    }
}

/// Parses a profile file's bytes; `origin` names it in errors.
pub fn parse(bytes: &[u8], origin: &str) -> Result<Profile, ProfileFileError> {
    from_json(serde_json::Deserializer::from_slice(bytes), origin).map_err(|e| match e {
        ReadError::Io(e) => ProfileFileError::Io {
            path: origin.into(),
            error: e,
        },
        ReadError::Profile(e) => e,
    })
}

/// Each frame of a call path costs at least this much memory once its names are
/// written out ([`StackFrame`], and the two names' heap blocks).
const FRAME_BYTES: usize = size_of::<StackFrame>() + 32;

/// The most frames a file's call paths may list: each number of a few bytes in the text
/// becomes a [`StackFrame`], and [`MAX_PROFILE_BYTES`] of them is what a file may take.
pub const MAX_FILE_FRAMES: usize = MAX_PROFILE_BYTES as usize / FRAME_BYTES;

/// The most functions and call paths one process of a file may list; a process over
/// either is left out with a line in [`Profile::unread`], the others read. A run keeps
/// at most `MAX_PATHS` paths a process (cpi-user/src/profile/paths.rs) and cc1, which
/// touches 5 489 functions, is a large program; a merge of windows may hold more.
pub const PROCESS_BOUNDS: Bounds = Bounds {
    functions: 1 << 18,
    paths: 1 << 16,
};

/// The profile of a file's JSON, read as a stream into the model: nothing the model
/// does not hold is kept (an unknown field is skipped as it is read), each process is
/// within [`PROCESS_BOUNDS`], the call paths' frames are at most [`MAX_FILE_FRAMES`],
/// and the version is checked as it is read, so a newer file says "newer", not
/// "missing field".
fn from_json<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
    origin: &str,
) -> Result<Profile, ReadError> {
    let mut file = FileState {
        origin: origin.to_string(),
        versioned: false,
        refused: None,
        functions: Vec::new(),
        frames: Vec::new(),
    };
    let ((read, numbered), unread) = bounds::collect(PROCESS_BOUNDS, || {
        frame_numbers::collect(MAX_FILE_FRAMES, || {
            let p = Profile::deserialize(Intercept {
                inner: &mut de,
                file: &mut file,
            })?;
            de.end().map(|()| p)
        })
    });
    let mut p = read.map_err(|e| {
        let origin = origin.to_string();
        if let Some(refused) = file.refused.take() {
            ReadError::Profile(refused)
        } else if e.io_error_kind().is_some() {
            ReadError::Io(e.into())
        } else if e.is_eof() || e.is_syntax() {
            ReadError::Profile(json_error(e, &origin))
        } else if !file.versioned {
            ReadError::Profile(ProfileFileError::NotAProfile { origin })
        } else {
            ReadError::Profile(ProfileFileError::Corrupt {
                origin,
                detail: e.to_string(),
            })
        }
    })?;
    p.unread = unread;
    write_out_frames(&mut p, &file, &numbered, origin).map_err(ReadError::Profile)?;
    cut_names(&mut p);
    p.format_version = PROFILE_FORMAT_VERSION;
    // Merging cuts blocks at their bounds (cpi-user/src/profile/merge.rs): a block that
    // ends before it starts is a corrupt file, found by fuzzing (tests/tests/it/fuzz.rs).
    let reversed = p
        .processes
        .iter()
        .flat_map(|x| &x.functions)
        .flat_map(|f| f.blocks.iter().map(move |b| (f, b)))
        .find(|(_, b)| b.end < b.start);
    if let Some((f, b)) = reversed {
        return Err(ReadError::Profile(ProfileFileError::Corrupt {
            origin: origin.to_string(),
            detail: format!(
                "a block of {} ends at {:#x}, before its start {:#x}",
                f.name, b.end, b.start
            ),
        }));
    }
    Ok(p)
}

/// What the reader keeps beside the profile: the version was read, why the file was
/// refused (its version), and format 2's frame table.
struct FileState {
    /// The file's name as given.
    origin: String,
    versioned: bool,
    refused: Option<ProfileFileError>,
    functions: Vec<TableFunction<'static>>,
    frames: Vec<TableFrame>,
}

/// The file's top-level object handed to [`Profile`]'s own deserialisation, less the
/// frame table (kept in [`FileState`]), its version checked on the way.
struct Intercept<'a, D> {
    inner: D,
    file: &'a mut FileState,
}

impl<'de, D: serde::Deserializer<'de>> serde::Deserializer<'de> for Intercept<'_, D> {
    type Error = D::Error;
    fn deserialize_any<V: serde::de::Visitor<'de>>(self, v: V) -> Result<V::Value, D::Error> {
        let file = self.file;
        self.inner
            .deserialize_map(InterceptVisitor { inner: v, file })
    }
    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, D::Error> {
        self.deserialize_any(v)
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

struct InterceptVisitor<'a, V> {
    inner: V,
    file: &'a mut FileState,
}

impl<'de, V: serde::de::Visitor<'de>> serde::de::Visitor<'de> for InterceptVisitor<'_, V> {
    type Value = V::Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a profile (a JSON object)")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(InterceptMap {
            map,
            file: self.file,
            version: None,
        })
    }
}

struct InterceptMap<'a, A> {
    map: A,
    file: &'a mut FileState,
    /// The version just read, handed to the profile as its `format_version`.
    version: Option<u32>,
}

impl<'de, A: serde::de::MapAccess<'de>> serde::de::MapAccess<'de> for InterceptMap<'_, A> {
    type Error = A::Error;
    fn next_key_seed<K: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        use serde::de::{Error, IntoDeserializer};
        loop {
            let Some(key) = self.map.next_key::<Cow<'de, str>>()? else {
                return Ok(None);
            };
            match &*key {
                "format_version" => {
                    self.file.versioned = true;
                    let v: Version = self.map.next_value()?;
                    match v.check(&self.file.origin) {
                        Ok(n) => self.version = Some(n),
                        Err(refused) => {
                            self.file.refused = Some(refused);
                            return Err(A::Error::custom("refused"));
                        }
                    }
                }
                "stack_functions" => {
                    let mut functions: Vec<TableFunction> = self
                        .map
                        .next_value()
                        .map_err(|e| A::Error::custom(format_args!("stack_functions: {e}")))?;
                    // Cut before they are written out into every frame that names them.
                    for f in &mut functions {
                        budget_in_place(f.name.to_mut());
                        budget_in_place(f.binary.to_mut());
                    }
                    self.file.functions = functions;
                    continue;
                }
                "stack_frames" => {
                    self.file.frames = self
                        .map
                        .next_value()
                        .map_err(|e| A::Error::custom(format_args!("stack_frames: {e}")))?;
                    continue;
                }
                _ => {}
            }
            return seed.deserialize(key.into_deserializer()).map(Some);
        }
    }
    fn next_value_seed<V: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, A::Error> {
        use serde::de::IntoDeserializer;
        match self.version.take() {
            Some(n) => seed.deserialize(n.into_deserializer()),
            None => self.map.next_value_seed(seed),
        }
    }
}

/// A file's `format_version` as read: a number, or what stood there instead.
enum Version {
    Number(u64),
    Not(String),
}

impl Version {
    /// The version when this build reads it; else why the file `origin` is refused.
    fn check(self, origin: &str) -> Result<u32, ProfileFileError> {
        let origin = origin.to_string();
        match self {
            Version::Not(v) => Err(ProfileFileError::Corrupt {
                origin,
                detail: format!("format_version is {v}, not a version number"),
            }),
            Version::Number(0) => Err(ProfileFileError::Corrupt {
                origin,
                detail: "format_version 0 was never written".into(),
            }),
            Version::Number(found) if found > PROFILE_FORMAT_VERSION as u64 => {
                Err(ProfileFileError::FutureVersion {
                    origin,
                    found,
                    supported: PROFILE_FORMAT_VERSION,
                })
            }
            Version::Number(n) => Ok(n as u32),
        }
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Version, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Version;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a version number")
            }
            fn visit_u64<E>(self, n: u64) -> Result<Version, E> {
                Ok(Version::Number(n))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Version, E> {
                Ok(Version::Not(n.to_string()))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Version, E> {
                Ok(Version::Not(n.to_string()))
            }
            fn visit_bool<E>(self, b: bool) -> Result<Version, E> {
                Ok(Version::Not(b.to_string()))
            }
            fn visit_str<E>(self, _: &str) -> Result<Version, E> {
                Ok(Version::Not("a string".into()))
            }
            fn visit_unit<E>(self) -> Result<Version, E> {
                Ok(Version::Not("null".into()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut s: A,
            ) -> Result<Version, A::Error> {
                while s.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Version::Not("a list".into()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Version, A::Error> {
                while m
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Version::Not("an object".into()))
            }
        }
        d.deserialize_any(V)
    }
}

/// The names another process gave (comm, binaries, functions, frames, call edges) cut
/// to their budget (cpi-user/src/fsafe/text.rs), as the collector cuts them: a file
/// written before the budget, or by someone else, draws no longer names than a run.
fn cut_names(p: &mut Profile) {
    for b in &mut p.binaries {
        budget_in_place(&mut b.path);
    }
    for x in &mut p.processes {
        budget_in_place(&mut x.comm);
        for f in &mut x.functions {
            budget_in_place(&mut f.name);
            budget_in_place(&mut f.binary);
            // A cut symbol names nothing BOLT could find.
            f.mangled.take_if(|m| m.len() > MAX_NAME_BYTES);
            for e in &mut f.edges {
                for s in [&mut e.to_function, &mut e.to_binary].into_iter().flatten() {
                    budget_in_place(s);
                }
            }
        }
        for c in &mut x.calls {
            for s in [
                &mut c.caller,
                &mut c.caller_binary,
                &mut c.callee,
                &mut c.callee_binary,
            ] {
                budget_in_place(s);
            }
        }
        for f in x.stacks.iter_mut().flat_map(|s| &mut s.frames) {
            budget_in_place(&mut f.function);
            budget_in_place(&mut f.binary);
        }
    }
}

/// Format 2's call paths as the model holds them: each numbered frame replaced by its
/// frame from the table. Bounded: the frames written out hold at most
/// [`MAX_PROFILE_BYTES`] of names, what a format-1 file could, so a small file naming
/// one long name many times does not grow memory without end.
fn write_out_frames(
    p: &mut Profile,
    file: &FileState,
    numbered: &[bool],
    origin: &str,
) -> Result<(), ProfileFileError> {
    let corrupt = |detail: String| ProfileFileError::Corrupt {
        origin: origin.to_string(),
        detail,
    };
    let frames = || {
        p.processes
            .iter()
            .flat_map(|x| &x.stacks)
            .flat_map(|s| &s.frames)
            .zip(numbered)
            .filter(|(_, &n)| n)
            .map(|(f, _)| f.address)
    };
    // Checked before a frame is written out: a refused file costs no copies.
    let mut bytes = 0u64;
    for n in frames() {
        let frame = file.frames.get(n as usize).ok_or_else(|| {
            corrupt(format!(
                "a call path names frame {n} of {} in stack_frames",
                file.frames.len()
            ))
        })?;
        let func = file.functions.get(frame.function as usize).ok_or_else(|| {
            corrupt(format!(
                "a frame names function {} of {} in stack_functions",
                frame.function,
                file.functions.len()
            ))
        })?;
        bytes += (func.name.len() + func.binary.len() + FRAME_BYTES) as u64;
        if bytes > MAX_PROFILE_BYTES {
            return Err(ProfileFileError::TooLarge {
                origin: origin.to_string(),
            });
        }
    }
    let all = p
        .processes
        .iter_mut()
        .flat_map(|x| &mut x.stacks)
        .flat_map(|s| &mut s.frames);
    for (f, _) in all.zip(numbered).filter(|(_, &n)| n) {
        let frame = &file.frames[f.address as usize];
        let func = &file.functions[frame.function as usize];
        *f = StackFrame {
            function: func.name.to_string(),
            binary: func.binary.to_string(),
            address: frame.address,
        };
    }
    Ok(())
}

impl Profile {
    /// Parses the JSON profile file format (see [`parse`]).
    pub fn from_json(bytes: &[u8]) -> Result<Profile, ProfileFileError> {
        parse(bytes, "(input)")
    }
}

/// Where [`write_output`] writes.
#[derive(Debug, PartialEq, Eq)]
enum Dest {
    /// A new file, temp + rename (cpi-user/src/fsafe/mod.rs): what was at the path, a
    /// planted link included, is replaced, never written through.
    Replace,
    /// An existing FIFO or character device (`/dev/null`, a terminal, a pipe through
    /// `/dev/stdout`), written in place.
    InPlace,
}

/// How `path` is written: through a link only when this user owns it (as the kernel's
/// `fs.protected_symlinks` rule: another user's link in a shared directory is never
/// followed); in place only for FIFOs and character devices; a directory or a block
/// device is refused.
fn destination(path: &Path) -> std::io::Result<Dest> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let refuse = |what: &str| Err(std::io::Error::other(format!("is a {what}")));
    let own_link = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Dest::Replace),
        Err(e) => return Err(e),
        Ok(m) if m.file_type().is_symlink() => m.uid() == crate::fsafe::euid(),
        Ok(_) => true,
    };
    if !own_link {
        return Ok(Dest::Replace);
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => refuse("directory"),
        Ok(m) if m.file_type().is_block_device() => refuse("block device"),
        Ok(m) if m.file_type().is_fifo() || m.file_type().is_char_device() => Ok(Dest::InPlace),
        Ok(_) => Ok(Dest::Replace),
        // A dangling link of our own: replaced.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Dest::Replace),
        Err(e) => Err(e),
    }
}

/// A FIFO or device [`check_output`] opened, kept for [`write_output`] to write. Opening
/// a FIFO to check it and closing it again ended its reader (`cat FIFO` saw end of
/// file and left), so the profile written at the end found no reader and was lost
/// (a FIFO given to `-o` while a reader waits). A process writes one `--output`, so one slot is enough.
static HELD: std::sync::Mutex<Option<(PathBuf, std::fs::File)>> = std::sync::Mutex::new(None);

/// Checks, before any work, that [`write_output`] can write `path`: a probe file is
/// created and removed next to it, or the FIFO or device is opened and kept open for
/// the write (a FIFO without a reader is an error now, not at the end).
pub fn check_output(path: &Path) -> std::io::Result<()> {
    match destination(path)? {
        Dest::InPlace => {
            let mut held = HELD
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if held.as_ref().is_none_or(|(p, _)| p != path) {
                *held = Some((path.to_path_buf(), crate::fsafe::open_in_place(path)?));
            }
            Ok(())
        }
        Dest::Replace => {
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if !dir.is_dir() {
                return Err(std::io::Error::other(format!(
                    "folder {} does not exist",
                    dir.display()
                )));
            }
            let probe = dir.join(format!(".cpi-bpf-probe-{:016x}", rand::random::<u64>()));
            crate::fsafe::create_new(&probe)?;
            std::fs::remove_file(&probe)
        }
    }
}

/// Writes to `path` (`--output`) what `write` writes: a new file (mode 0600) made by
/// temp + rename (an existing regular file kept as `path.old` once the new one is
/// written), or an existing FIFO or character device written in place (see
/// `destination`).
pub fn write_output(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    match destination(path)? {
        Dest::InPlace => {
            let held = HELD
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take_if(|(p, _)| p == path);
            match held {
                Some((_, mut f)) => write(&mut f),
                None => write(&mut crate::fsafe::open_in_place(path)?),
            }
        }
        Dest::Replace => crate::fsafe::replace(path, |f| {
            write(f)?;
            keep_old(path)
        }),
    }
}
