//! Accuracy (being built).
