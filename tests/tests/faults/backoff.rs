//! Faults: backoff (see main.rs).
