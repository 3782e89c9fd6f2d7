//! Faults: overhead (see main.rs).
