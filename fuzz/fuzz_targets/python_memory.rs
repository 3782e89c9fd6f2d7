//! A CPython process's memory as spanprof's user-space readers see it: the input is mapped at
//! a low address and read as a code object (names and line table), a thread list and frame
//! chain, dicts, attributes, strs, tuples and small ints, `sys.modules` for the tracing
//! libraries, `threading._active` for thread names, `_Py_DebugOffsets`, and the naming cache's
//! validation, with the offsets of the version the first byte picks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profiler_common::PyFrame;
use spanprof_fuzz::{memory, split_selector, u32_at, BASE};
use symbolizer::python::names::CodeNames;
use symbolizer::python::objects::{ObjectOffsets, Objects, SpanFinder};
use symbolizer::python::offsets;
use symbolizer::python::walk::{self, TypeAddrs};

fuzz_target!(|data: &[u8]| {
    let Some((selector, rest)) = split_selector(data) else {
        return;
    };
    let py = offsets::ALL[usize::from(selector) % offsets::ALL.len()];
    let mem = memory(rest);
    // Type checks on or off: off lets the fuzzer past them without guessing addresses.
    let types = if selector & 0x80 != 0 {
        TypeAddrs {
            code: Some(BASE + 0x40),
            unicode: Some(BASE + 0x80),
        }
    } else {
        TypeAddrs::default()
    };
    if let Ok(info) = walk::code_info(&mem, py, types, BASE) {
        let _ = info.line(u32_at(rest, 0));
    }
    let _ = walk::walk_thread(&mem, py, BASE, u32_at(rest, 4));
    let mut names = CodeNames::new(mem.clone(), py, types);
    let frame = PyFrame {
        code: BASE,
        check: u64::from(u32_at(rest, 8)),
        instr: u32_at(rest, 12),
        flags: 0,
    };
    let _ = names.resolve(&frame, |_| 1);
    let _ = names.resolve(&frame, |_| 2);
    let Some(obj) = ObjectOffsets::for_version(py.version.0, py.version.1) else {
        return;
    };
    let o = Objects { mem: &mem, py, obj };
    let _ = o.type_name(BASE);
    let _ = o.str(BASE);
    let _ = o.dict_entries(BASE);
    let _ = o.dict_get(BASE, "_context");
    let _ = o.attrs(BASE);
    let _ = o.getattr(BASE, "_trace_stack");
    let _ = o.tuple(BASE);
    let _ = o.module_dict(BASE);
    let _ = o.code_name(BASE, "__init__");
    let _ = o.type_attr(BASE, "_name");
    let _ = o.small_int(BASE);
    let _ = o.thread_names(BASE);
    let _ = offsets::DebugOffsets::parse(rest);
    let mut finder = SpanFinder::default();
    let _ = finder.look(&o, BASE);
    let _ = finder.look(&o, BASE);
});
