//! Faults: memory (see main.rs).
