//! profiler-common
