//! symbolizer
