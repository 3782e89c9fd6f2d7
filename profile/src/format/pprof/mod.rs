//! pprof `profile.proto`: [`write`] makes it from a [`Profile`](crate::profile::Profile) (the
//! layout, labels and comments are described there), [`read`] reads a file spanprof wrote back
//! into the same [`Profile`]. The names both sides agree on (sample types, mappings, labels,
//! comments) are the writer's constants, re-exported here.

pub mod read;
mod write;

pub use read::{read_pprof, read_pprof_within};
pub use write::*;
