//! A recording given to `spanprof replay` (`profile --record`): read it, gzipped or not, run
//! the count and assemble stages from it, then compute and render everything `report` can from
//! the profile.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spanprof_pipeline::replay;

fuzz_target!(|data: &[u8]| {
    let replayed = if data.starts_with(&[0x1f, 0x8b]) {
        replay::replay_gzip(data)
    } else {
        replay::replay(data)
    };
    if let Ok(replayed) = replayed {
        spanprof_fuzz::report_everything(&replayed.profile);
    }
});
