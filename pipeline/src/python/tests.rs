use super::*;
use symbolizer::python::detect::{PyVersion, VersionSource};
use symbolizer::python::offsets::ALL;

fn process(minor: u8) -> PythonProcess {
    PythonProcess {
        pid: 1,
        version: PyVersion {
            major: 3,
            minor,
            patch: Some(0),
        },
        version_source: VersionSource::PyVersionSymbol,
        module: "/usr/lib/libpython3.so".into(),
        load_bias: 0,
        runtime_addr: 0x7000,
        code_type_addr: None,
        unicode_type_addr: None,
        hash_secret_addr: None,
        hamt_types: [None; 3],
        eval_ranges: vec![],
        debug_build: false,
        frame_pointers: false,
    }
}

#[test]
fn every_table_fits_the_kernel_walker() {
    for o in ALL {
        let p =
            py_proc(&process(o.version.1), o).unwrap_or_else(|e| panic!("3.{}: {e}", o.version.1));
        assert_eq!(p.runtime_addr, 0x7000);
        assert!(p.frame_size <= PY_FRAME_BLOCK && p.frame_size > 0);
        assert!(p.code_size <= PY_CODE_BLOCK && p.code_size >= 12);
        let expected_entry = match o.version.1 {
            8..=10 => PY_ENTRY_EVERY_FRAME,
            11 => PY_ENTRY_FIELD,
            _ => PY_ENTRY_SHIM,
        };
        assert_eq!(p.entry_kind, expected_entry, "3.{}", o.version.1);
        let expected_match = if o.version.1 >= 11 {
            PY_MATCH_NATIVE_TID
        } else {
            PY_MATCH_PTHREAD
        };
        assert_eq!(p.tstate_match, expected_match);
    }
}

#[test]
fn tokens_round_trip() {
    let t = 7u64 | (1234u64 << 32) | TOKEN_ENTRY;
    assert_eq!(split_token(t), (7, 1234, true));
    assert_eq!(split_token(3), (3, 0, false));
}
