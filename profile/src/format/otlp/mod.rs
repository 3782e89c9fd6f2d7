//! OTLP profiles requests (`ExportProfilesServiceRequest`, proto v1.10.0 `v1development`):
//! [`write`] makes one from a [`Profile`](crate::profile::Profile), [`read`] reads one back.

pub mod read;
mod write;

pub use read::{read_otlp, read_otlp_within};
pub use write::*;
