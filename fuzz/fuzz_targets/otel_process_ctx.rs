//! An OTEP 4719 process context read from a target's memory: the 32-byte `OTEL_CTX` header
//! at the mapping's start, the payload it points to, and the `ProcessContext` protobuf in it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spanprof_fuzz::{memory, BASE};
use symbolizer::otel_ctx;

fuzz_target!(|data: &[u8]| {
    // The payload alone, as the decoder sees it.
    let _ = otel_ctx::decode_process_ctx(data);
    // The header at the start of the input, with a payload pointer anywhere.
    let _ = otel_ctx::read_process_ctx_at(BASE, &memory(data));
});
