//! A module file mapped by a target, looked at for the OTEP 4947 thread-local
//! `otel_thread_ctx_v1`: its ELF headers, `.dynsym` and dynamic relocations; then the
//! symbol's access worked out from what the input says the loader wrote.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spanprof_fuzz::{memory, BASE};
use symbolizer::otel_ctx;

fuzz_target!(|data: &[u8]| {
    let Some(sym) = otel_ctx::parse_module_bytes(data) else {
        return;
    };
    // The same bytes stand for the loaded module's memory.
    let _ = otel_ctx::tls_access(&sym, BASE, &memory(data));
});
