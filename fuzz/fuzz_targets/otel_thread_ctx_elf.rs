//! A module file mapped by a target, looked at for the OTEP 4947 thread-local
//! `otel_thread_ctx_v1`: its ELF headers, `.dynsym` and dynamic relocations; then the
//! symbol's access worked out from what the input says the loader wrote. The same bytes are
//! also read as an interpreter module whose loop's cold part is looked for (`python::cold`),
//! and as greenlet's module (its `.symtab`, `.dynsym`, TLS segment and relocations).
#![no_main]

use libfuzzer_sys::fuzz_target;
use spanprof_fuzz::{memory, BASE};
use symbolizer::otel_ctx;

fuzz_target!(|data: &[u8]| {
    // The same bytes as the interpreter module whose loop's cold part is looked for.
    let _ = symbolizer::python::cold::cold_part(data, (0x1000, 0x1400));
    // And as greenlet's module.
    let _ = symbolizer::greenlet::parse_greenlet_bytes(data);
    let Some(sym) = otel_ctx::parse_module_bytes(data) else {
        return;
    };
    // The same bytes stand for the loaded module's memory.
    let _ = otel_ctx::tls_access(&sym, BASE, &memory(data));
});
