//! Rendering and exporting a [`crate::profile::Profile`]: human tables, the versioned
//! JSON profile file, pprof and BOLT `.fdata`; and reading `perf script` branch-stack
//! text back into wire samples (`import-perf`).

pub mod fdata;
pub mod file;
pub mod perf_script;
pub mod pprof;
pub mod table;

pub use file::ProfileFileError;
pub use table::{TableError, TableOptions};
