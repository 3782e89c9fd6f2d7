//! Faults: io (see main.rs).
