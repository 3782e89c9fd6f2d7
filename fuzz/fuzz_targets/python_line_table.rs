//! A code object's line table (`co_lnotab` of 3.8–3.9, PEP 626 `co_linetable` of 3.10, the
//! location table of 3.11+), read from a target: the line of an instruction offset.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spanprof_fuzz::{split_selector, u32_at};
use symbolizer::python::lines::{line_for, line_for_format, line_for_prefix, LineTableFormat};

fuzz_target!(|data: &[u8]| {
    let Some((selector, rest)) = split_selector(data) else {
        return;
    };
    let first_line = u32_at(rest, 0);
    let offset = u32_at(rest, 4);
    let table = rest.get(8..).unwrap_or_default();
    let format = match selector % 3 {
        0 => LineTableFormat::Lnotab,
        1 => LineTableFormat::Pep626,
        _ => LineTableFormat::Locations,
    };
    let _ = line_for_format(format, first_line, table, offset);
    let _ = line_for_prefix(format, first_line, table, selector & 0x80 == 0, offset);
    let _ = line_for(selector & 0x0f, first_line, table, offset);
});
