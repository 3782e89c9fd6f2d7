//! Faults: children (see main.rs).
