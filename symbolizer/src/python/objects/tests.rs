use super::*;
use crate::python::memory::FixtureMemory;
use crate::python::offsets;

/// A compact ASCII str at `addr` (the 3.11 layout: data after 48 bytes).
fn put_str(mem: &mut FixtureMemory, addr: u64, text: &str, hash: u64) {
    let mut b = vec![0u8; 48 + text.len() + 1];
    b[16..24].copy_from_slice(&(text.len() as u64).to_le_bytes());
    b[24..32].copy_from_slice(&hash.to_le_bytes());
    // kind 1, compact, ascii
    b[32..36].copy_from_slice(&((1u32 << 2) | (1 << 5) | (1 << 6)).to_le_bytes());
    b[48..48 + text.len()].copy_from_slice(text.as_bytes());
    mem.insert(addr, b);
}

/// A 3.11+ str-keyed dict at `dict` with its keys at `keys`: 8 slots, 1-byte indexes.
fn put_dict(mem: &mut FixtureMemory, dict: u64, keys: u64, entries: &[(u64, u64)]) {
    let mut d = vec![0u8; 48];
    d[32..40].copy_from_slice(&keys.to_le_bytes());
    mem.insert(dict, d);
    let mut k = vec![0u8; 32 + 8 + 8 * 16];
    k[8] = 3; // log2 size
    k[9] = 3; // log2 index bytes
    k[10] = 1; // DICT_KEYS_UNICODE
    k[24..32].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    for (i, (key, value)) in entries.iter().enumerate() {
        let e = 40 + i * 16;
        k[e..e + 8].copy_from_slice(&key.to_le_bytes());
        k[e + 8..e + 16].copy_from_slice(&value.to_le_bytes());
    }
    mem.insert(keys, k);
}

fn objects(mem: &FixtureMemory) -> Objects<'_, FixtureMemory> {
    Objects {
        mem,
        py: offsets::for_version(3, 11).unwrap(),
        obj: ObjectOffsets::for_version(3, 11).unwrap(),
    }
}

#[test]
fn dict_entries_and_str_keys() {
    let mut mem = FixtureMemory::new();
    put_str(&mut mem, 0x10_000, "_RUNTIME_CONTEXT", 7);
    put_str(&mut mem, 0x11_000, "other", 8);
    put_dict(
        &mut mem,
        0x20_000,
        0x21_000,
        &[(0x11_000, 0xaa), (0x10_000, 0xbb)],
    );
    let o = objects(&mem);
    assert_eq!(
        o.dict_entries(0x20_000).unwrap(),
        vec![(0x11_000, 0xaa), (0x10_000, 0xbb)]
    );
    assert_eq!(
        o.dict_get(0x20_000, "_RUNTIME_CONTEXT").unwrap(),
        Some((0x10_000, 0xbb))
    );
    assert_eq!(o.dict_get(0x20_000, "missing").unwrap(), None);
    assert_eq!(o.str_hash(0x10_000).unwrap(), 7);
}

#[test]
fn garbage_is_an_error_never_a_panic() {
    // Every region filled with one byte value: pointers lead nowhere or back into garbage.
    for fill in [0u8, 0x01, 0x7f, 0xff] {
        let mut mem = FixtureMemory::new();
        mem.insert(0x10_000, vec![fill; 4096]);
        let o = objects(&mem);
        let _ = o.dict_entries(0x10_000);
        let _ = o.attrs(0x10_000);
        let _ = o.tuple(0x10_000);
        let _ = o.type_name(0x10_000);
        let _ = o.code_name(0x10_000, "x");
        let _ = SpanFinder::default().look(&o, 0x10_000);
    }
    // Sizes that would make huge reads are refused before reading.
    let mut mem = FixtureMemory::new();
    let mut keys = vec![0u8; 64];
    keys[8] = 30; // 2^30 slots
    keys[9] = 30;
    keys[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    mem.insert(0x10_000, keys);
    assert!(matches!(
        objects(&mem).keys_entries(0x10_000, 0),
        Err(ObjectError::Invalid(_))
    ));
}

/// An object of the type named `name` at `obj` (`size` bytes), its type at `ty`.
fn put_typed(mem: &mut FixtureMemory, obj: u64, size: usize, ty: u64, name: &str) {
    let mut o = vec![0u8; size];
    o[8..16].copy_from_slice(&ty.to_le_bytes());
    mem.insert(obj, o);
    // The type: tp_name at 24 (pointing to the text right after it), tp_dict at 264.
    let mut t = vec![0u8; 1024];
    t[24..32].copy_from_slice(&(ty + 512).to_le_bytes());
    t[512..512 + name.len()].copy_from_slice(name.as_bytes());
    mem.insert(ty, t);
}

/// A module whose class `class` has the method `method`, whose code names `names`.
fn put_module(mem: &mut FixtureMemory, base: u64, class: &str, method: &str, names: &[u64]) {
    let (module, globals, class_obj, class_dict, func, code, tuple) = (
        base,
        base + 0x1000,
        base + 0x3000,
        base + 0x4000,
        base + 0x6000,
        base + 0x7000,
        base + 0x8000,
    );
    put_typed(mem, module, 64, base + 0x10_000, "module");
    mem.write(module + 16, &globals.to_le_bytes());
    put_str(mem, base + 0x20_000, class, 1);
    put_dict(
        mem,
        globals,
        globals + 0x800,
        &[(base + 0x20_000, class_obj)],
    );
    // The class: its own type object; tp_dict at 264.
    let mut c = vec![0u8; 1024];
    c[264..272].copy_from_slice(&class_dict.to_le_bytes());
    mem.insert(class_obj, c);
    put_str(mem, base + 0x21_000, method, 2);
    put_dict(
        mem,
        class_dict,
        class_dict + 0x800,
        &[(base + 0x21_000, func)],
    );
    // A function (3.11: func_code at 48), its code (co_names at 32), the names tuple.
    put_typed(mem, func, 64, base + 0x30_000, "function");
    mem.write(func + 48, &code.to_le_bytes());
    let mut c = vec![0u8; 64];
    c[32..40].copy_from_slice(&tuple.to_le_bytes());
    mem.insert(code, c);
    let mut t = vec![0u8; 24 + 8 * names.len()];
    t[16..24].copy_from_slice(&(names.len() as u64).to_le_bytes());
    for (i, n) in names.iter().enumerate() {
        t[24 + 8 * i..32 + 8 * i].copy_from_slice(&n.to_le_bytes());
    }
    mem.insert(tuple, t);
}

#[test]
fn name_attribute_is_found_in_either_library() {
    let mut mem = FixtureMemory::new();
    // The interned `_name`, a str (its type named "str"), and another name.
    let (name, other, str_type) = (0x50_000, 0x51_000, 0x52_000);
    put_str(&mut mem, name, "_name", 99);
    put_str(&mut mem, other, "_context", 98);
    put_typed(&mut mem, 0x53_000, 16, str_type, "str");
    mem.write(name + 8, &str_type.to_le_bytes());
    put_module(
        &mut mem,
        0x100_000,
        "ReadableSpan",
        "__init__",
        &[other, name],
    );
    put_module(&mut mem, 0x200_000, "_Profiler", "start", &[name]);
    let o = objects(&mem);
    let want = Some(NameObjects {
        attr: Key {
            addr: name,
            hash: 99,
        },
        str_type,
    });
    // The SDK alone, OSProfiler alone, both.
    let mut finder = SpanFinder::default();
    assert_eq!(finder.find_names(&o).unwrap(), None, "no library yet");
    finder.modules[4] = 0x100_000;
    assert_eq!(finder.find_names(&o).unwrap(), want);
    finder.modules = [0, 0, 0, 0x200_000, 0, 0];
    assert_eq!(finder.find_names(&o).unwrap(), want);
    // An SDK mid-import (no ReadableSpan yet: garbage for a module) does not hide OSProfiler.
    finder.modules[4] = 0x53_000;
    assert_eq!(finder.find_names(&o).unwrap(), want);
    // Code without `_name`: not found.
    let mut mem = FixtureMemory::new();
    put_str(&mut mem, other, "_context", 98);
    put_module(&mut mem, 0x100_000, "ReadableSpan", "__init__", &[other]);
    let finder = SpanFinder {
        modules: [0, 0, 0, 0, 0x100_000, 0],
        ..SpanFinder::default()
    };
    assert_eq!(finder.find_names(&objects(&mem)).unwrap(), None);
}

#[test]
fn hamt_hash_folds_like_cpython() {
    assert_eq!(hamt_hash(0x0000_0001_0000_0002), 3);
    assert_eq!(hamt_hash(0xffff_ffff_0000_0000), u32::MAX - 1); // -1 becomes -2
    assert_eq!(hamt_hash(0x1234_5678), 0x1234_5678);
}

/// The hashes of CPython 3.10 (SipHash-2-4) and 3.11 (SipHash-1-3) run with
/// `PYTHONHASHSEED=0` (an all-zero `_Py_HashSecret`): `hash('current-span-0')`, `hash('a')`.
#[test]
fn str_hashes_are_cpythons() {
    let h = |sip13, s: &str| py_hash_bytes(sip13, [0, 0], s.as_bytes()) as i64;
    assert_eq!(h(false, "current-span-0"), 8825921094536252018);
    assert_eq!(h(false, "a"), -7583489610679606711);
    assert_eq!(h(true, "current-span-0"), -2419921713978341468);
    assert_eq!(h(true, "_SPAN_KEY"), 5117728836703989919);
    assert_eq!(h(true, ""), 0);
}

#[test]
fn every_version_has_a_table() {
    for minor in 8..=crate::python::offsets::NEWEST_MINOR {
        assert!(ObjectOffsets::for_version(3, minor).is_some());
    }
    assert!(ObjectOffsets::for_version(3, 7).is_none());
}
