//! Output sinks (placeholder, being written).
