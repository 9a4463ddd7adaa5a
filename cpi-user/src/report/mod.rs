//! Rendering and exporting a [`crate::profile::Profile`].

pub mod table;
