//! Rendering and exporting a [`crate::profile::Profile`]: human tables, the versioned
//! JSON profile file, pprof, OTLP profiles and BOLT `.fdata`.

pub mod diff;
pub mod fdata;
pub mod file;
pub mod folded;
pub mod html;
pub mod otlp;
pub mod pprof;
pub mod table;
pub(crate) mod terminal;
pub mod time;

pub use file::ProfileFileError;
pub use table::{TableError, TableOptions};
