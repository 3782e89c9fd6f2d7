//! Checks the hand-written tables in [`super::offsets`] against each version's installed
//! CPython headers: a C file of `_Static_assert(offsetof(...) == <table value>)` lines is
//! generated from the Rust table and compiled with `cc -fsyntax-only -DPy_BUILD_CORE` against
//! pyenv's `include/python3.X` (and its `internal/`), once per installed 3.8–3.13 version,
//! and Debian sid's 3.14 and 3.15 headers in `target/sid-rootfs` (made by `cargo xtask test`).
//!
//! Not checked here, because no header expresses them:
//! - [`offsets::GLIBC_PTHREAD_TID_OFFSET`] is glibc's `struct pthread`, not CPython's;
//! - `FrameLayout::FrameObject::lasti_in_code_units` is a change in meaning (3.10), not in
//!   layout;
//! - a table's `None` for a field the headers do have (3.11's `owner`: no shim frames there) is
//!   a choice, and the absence of a field (`native_thread_id` before 3.11) cannot be asserted.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::objects::{DictLayout, ObjectOffsets, TPFLAGS_INLINE_VALUES, TPFLAGS_MANAGED_DICT};
use super::offsets::{self, FrameLayout, GilAt, PyOffsets, ThreadIdMatch};

/// One C integer constant expression and the value the table says it has.
struct Check {
    /// Table field, for the message.
    field: &'static str,
    /// C expression, e.g. `offsetof(PyThreadState, next)`.
    expr: String,
    value: u64,
}

/// The crate's directory, from the `CARGO_MANIFEST_DIR` `cargo test` gives the running test
/// (else the one it was built with): a test binary built in one clone can run in another
/// (`cargo xtask test` shares its build directory), and must read its own clone's files.
pub(super) fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

fn check(field: &'static str, expr: impl Into<String>, value: u64) -> Check {
    Check {
        field,
        expr: expr.into(),
        value,
    }
}

/// Headers that define every struct a table describes, relative to `include/python3.X`.
fn headers(minor: u8) -> &'static [&'static str] {
    match minor {
        // 3.8: _PyRuntimeState and PyInterpreterState are both in pycore_pystate.h;
        // frameobject.h is not pulled in by Python.h before 3.11.
        8 => &[
            "Python.h",
            "frameobject.h",
            "internal/pycore_pystate.h",
            "internal/pycore_context.h",
        ],
        9 | 10 => &[
            "Python.h",
            "frameobject.h",
            "internal/pycore_runtime.h",
            "internal/pycore_interp.h",
            "internal/pycore_context.h",
        ],
        _ => &[
            "Python.h",
            "internal/pycore_runtime.h",
            "internal/pycore_interp.h",
            "internal/pycore_frame.h",
            "internal/pycore_context.h",
            "internal/pycore_dict.h",
        ],
    }
}

/// The checks of a version's [`ObjectOffsets`]. Not checkable here (no header has them):
/// before 3.11 the dict keys layout (Objects/dict-common.h), and `localobject`
/// (Modules/_threadmodule.c); the span tests read real objects through both.
fn object_checks(o: &ObjectOffsets) -> Vec<Check> {
    let minor = o.version.1;
    let mut c = vec![
        check(
            "tuple_items",
            "offsetof(PyTupleObject, ob_item)",
            o.tuple_items,
        ),
        check(
            "interp_modules",
            if minor <= 11 {
                "offsetof(PyInterpreterState, modules)"
            } else {
                "offsetof(PyInterpreterState, imports.modules)"
            },
            o.interp_modules,
        ),
        check(
            "tstate_context",
            "offsetof(PyThreadState, context)",
            o.tstate_context,
        ),
        check(
            "tstate_dict",
            "offsetof(PyThreadState, dict)",
            o.tstate_dict,
        ),
        // The BPF program reads context, context_ver and id in one read, and compares the
        // last two with the ContextVar's cache (var_cached, var_cached_tsid, var_cached_tsver).
        check(
            "tstate_context + 8",
            "offsetof(PyThreadState, context_ver)",
            o.tstate_context + 8,
        ),
        check(
            "tstate_context + 16",
            "offsetof(PyThreadState, id)",
            o.tstate_context + 16,
        ),
        check(
            "CONTEXTVAR_CACHED",
            "offsetof(PyContextVar, var_cached)",
            32,
        ),
        check(
            "CONTEXTVAR_CACHED + 8",
            "offsetof(PyContextVar, var_cached_tsid)",
            40,
        ),
        check(
            "CONTEXTVAR_CACHED + 16",
            "offsetof(PyContextVar, var_cached_tsver)",
            48,
        ),
        check(
            "context_vars",
            "offsetof(PyContext, ctx_vars)",
            o.context_vars,
        ),
        check("hamt_root", "offsetof(PyHamtObject, h_root)", o.hamt_root),
        check(
            "contextvar_hash",
            "offsetof(PyContextVar, var_hash)",
            o.contextvar_hash,
        ),
        check("dict_keys", "offsetof(PyDictObject, ma_keys)", o.dict_keys),
        check(
            "dict_keys + 8",
            "offsetof(PyDictObject, ma_values)",
            o.dict_keys + 8,
        ),
        check("type_name", "offsetof(PyTypeObject, tp_name)", o.type_name),
        check(
            "type_basicsize",
            "offsetof(PyTypeObject, tp_basicsize)",
            o.type_basicsize,
        ),
        check(
            "type_flags",
            "offsetof(PyTypeObject, tp_flags)",
            o.type_flags,
        ),
        check("type_dict", "offsetof(PyTypeObject, tp_dict)", o.type_dict),
        check(
            "type_dictoffset",
            "offsetof(PyTypeObject, tp_dictoffset)",
            o.type_dictoffset,
        ),
        check(
            "type_cached_keys",
            "offsetof(PyHeapTypeObject, ht_cached_keys)",
            o.type_cached_keys,
        ),
        check(
            "func_code",
            "offsetof(PyFunctionObject, func_code)",
            o.func_code,
        ),
        check(
            "code_names",
            "offsetof(PyCodeObject, co_names)",
            o.code_names,
        ),
        check("PyLong_SHIFT", "PyLong_SHIFT", 30),
        check(
            "long size (ob_size or lv_tag)",
            if o.long_tag {
                "offsetof(PyLongObject, long_value.lv_tag)"
            } else {
                "offsetof(PyVarObject, ob_size)"
            },
            16,
        ),
    ];
    if let Some(k) = o.tstate_local_key {
        c.push(check(
            "tstate_local_key",
            "offsetof(PyThreadState, threading_local_key)",
            k,
        ));
    }
    if o.dict_layout == DictLayout::Log2 {
        c.push(check(
            "dict_layout (nentries)",
            "offsetof(PyDictKeysObject, dk_nentries)",
            24,
        ));
        c.push(check(
            "dict_layout (indices)",
            "offsetof(PyDictKeysObject, dk_indices)",
            32,
        ));
        c.push(check("entry size", "sizeof(PyDictKeyEntry)", 24));
        c.push(check(
            "unicode entry size",
            "sizeof(PyDictUnicodeEntry)",
            16,
        ));
    }
    if minor >= 11 {
        c.push(check(
            "TPFLAGS_MANAGED_DICT",
            "Py_TPFLAGS_MANAGED_DICT",
            TPFLAGS_MANAGED_DICT,
        ));
    }
    if minor >= 13 {
        c.push(check(
            "dict_values",
            "offsetof(PyDictValues, values)",
            o.dict_values,
        ));
        c.push(check(
            "TPFLAGS_INLINE_VALUES",
            "Py_TPFLAGS_INLINE_VALUES",
            TPFLAGS_INLINE_VALUES,
        ));
    }
    c
}

/// Every check a table implies, with the field names of its version.
fn checks(o: &PyOffsets) -> Vec<Check> {
    let (major, minor) = o.version;
    assert_eq!(major, 3);
    let mut c = vec![
        check(
            "runtime_interpreters_head",
            "offsetof(_PyRuntimeState, interpreters.head)",
            o.runtime_interpreters_head,
        ),
        check(
            "interp_threads_head",
            if minor <= 10 {
                "offsetof(PyInterpreterState, tstate_head)"
            } else {
                "offsetof(PyInterpreterState, threads.head)"
            },
            o.interp_threads_head,
        ),
        check(
            "tstate_next",
            "offsetof(PyThreadState, next)",
            o.tstate_next,
        ),
        check(
            "tstate_thread_id",
            "offsetof(PyThreadState, thread_id)",
            o.tstate_thread_id,
        ),
    ];
    match o.gil {
        GilAt::Runtime(off) => c.push(check("gil", "offsetof(_PyRuntimeState, ceval.gil)", off)),
        GilAt::InterpreterPointer(off) => {
            c.push(check("gil", "offsetof(PyInterpreterState, ceval.gil)", off));
            // A pointer to the state, not the state (`->` compiles on a pointer only).
            c.push(check(
                "gil (pointer)",
                "sizeof(((PyInterpreterState *)0)->ceval.gil->locked)",
                4,
            ));
        }
    }
    c.push(check(
        "GIL_LAST_HOLDER",
        "offsetof(struct _gil_runtime_state, last_holder)",
        offsets::GIL_LAST_HOLDER,
    ));
    c.push(check(
        "GIL_LOCKED",
        "offsetof(struct _gil_runtime_state, locked)",
        offsets::GIL_LOCKED,
    ));
    c.push(check(
        "GIL_SWITCH_NUMBER",
        "offsetof(struct _gil_runtime_state, switch_number)",
        offsets::GIL_SWITCH_NUMBER,
    ));
    c.push(check(
        "GIL_LOCKED (size)",
        "sizeof(((struct _gil_runtime_state *)0)->locked)",
        4,
    ));
    match o.thread_match {
        ThreadIdMatch::NativeThreadId(off) => c.push(check(
            "thread_match",
            "offsetof(PyThreadState, native_thread_id)",
            off,
        )),
        // glibc's tid offset is not CPython's; nothing to check against these headers.
        ThreadIdMatch::PthreadId => {}
    }

    // The thread state's frame field is named after the layout, so a wrong layout for a
    // version fails to compile.
    let (tstate_field, frame_struct) = match o.frame_layout {
        FrameLayout::FrameObject { .. } => ("frame", "PyFrameObject"),
        FrameLayout::CFrame { .. } => ("cframe", "_PyInterpreterFrame"),
        FrameLayout::Direct => ("current_frame", "_PyInterpreterFrame"),
    };
    c.push(check(
        "tstate_frame",
        format!("offsetof(PyThreadState, {tstate_field})"),
        o.tstate_frame,
    ));
    if let FrameLayout::CFrame { current_frame } = o.frame_layout {
        c.push(check(
            "frame_layout.current_frame",
            "offsetof(_PyCFrame, current_frame)",
            current_frame,
        ));
    }
    let (previous, code, instr) = match (o.frame_layout, minor) {
        (FrameLayout::FrameObject { .. }, _) => ("f_back", "f_code", "f_lasti"),
        (_, ..=12) => ("previous", "f_code", "prev_instr"),
        _ => ("previous", "f_executable", "instr_ptr"),
    };
    c.push(check(
        "frame_previous",
        format!("offsetof({frame_struct}, {previous})"),
        o.frame_previous,
    ));
    c.push(check(
        "frame_code",
        format!("offsetof({frame_struct}, {code})"),
        o.frame_code,
    ));
    c.push(check(
        "frame_instr",
        format!("offsetof({frame_struct}, {instr})"),
        o.frame_instr,
    ));
    if let FrameLayout::FrameObject { .. } = o.frame_layout {
        // The reader takes `f_lasti` as an `int`.
        c.push(check(
            "frame_instr (size)",
            "sizeof(((PyFrameObject *)0)->f_lasti)",
            4,
        ));
    } else {
        // The reader takes `prev_instr` / `instr_ptr` as a pointer.
        c.push(check(
            "frame_instr (size)",
            format!("sizeof((({frame_struct} *)0)->{instr})"),
            8,
        ));
    }
    if let Some(entry) = o.frame_is_entry {
        c.push(check(
            "frame_is_entry",
            "offsetof(_PyInterpreterFrame, is_entry)",
            entry,
        ));
        c.push(check(
            "frame_is_entry (size)",
            "sizeof(((_PyInterpreterFrame *)0)->is_entry)",
            1,
        ));
    }
    if let Some(owner) = o.frame_owner {
        c.push(check(
            "frame_owner",
            "offsetof(_PyInterpreterFrame, owner)",
            owner,
        ));
        c.push(check(
            "frame_owner (size)",
            "sizeof(((_PyInterpreterFrame *)0)->owner)",
            1,
        ));
        // Every owner above the frame object's is a frame that runs no Python function: the
        // C-stack shim (3.12–3.14), the interpreter's base or entry frame (3.14–3.15).
        c.push(check(
            "FRAME_OWNED_BY_SHIM",
            "FRAME_OWNED_BY_FRAME_OBJECT + 1",
            offsets::FRAME_OWNED_BY_SHIM.into(),
        ));
    }

    c.push(check(
        "code_name",
        "offsetof(PyCodeObject, co_name)",
        o.code_name,
    ));
    if let Some(q) = o.code_qualname {
        c.push(check(
            "code_qualname",
            "offsetof(PyCodeObject, co_qualname)",
            q,
        ));
    }
    c.push(check(
        "code_filename",
        "offsetof(PyCodeObject, co_filename)",
        o.code_filename,
    ));
    c.push(check(
        "code_firstlineno",
        "offsetof(PyCodeObject, co_firstlineno)",
        o.code_firstlineno,
    ));
    c.push(check(
        "code_firstlineno (size)",
        "sizeof(((PyCodeObject *)0)->co_firstlineno)",
        4,
    ));
    c.push(check(
        "code_linetable",
        if minor <= 9 {
            "offsetof(PyCodeObject, co_lnotab)"
        } else {
            "offsetof(PyCodeObject, co_linetable)"
        },
        o.code_linetable,
    ));
    if let Some(v) = o.code_version {
        c.push(check(
            "code_version",
            "offsetof(PyCodeObject, co_version)",
            v,
        ));
        c.push(check(
            "code_version (size)",
            "sizeof(((PyCodeObject *)0)->co_version)",
            4,
        ));
    }
    if let Some(a) = o.code_adaptive {
        c.push(check(
            "code_adaptive",
            "offsetof(PyCodeObject, co_code_adaptive)",
            a,
        ));
    }

    c.push(check(
        "unicode_length",
        "offsetof(PyASCIIObject, length)",
        o.unicode_length,
    ));
    c.push(check(
        "unicode_state",
        "offsetof(PyASCIIObject, state)",
        o.unicode_state,
    ));
    c.push(check(
        "unicode_ascii_size",
        "sizeof(PyASCIIObject)",
        o.unicode_ascii_size,
    ));
    c.push(check(
        "unicode_compact_size",
        "sizeof(PyCompactUnicodeObject)",
        o.unicode_compact_size,
    ));
    c
}

/// The C file: the headers, then one line per check made by `line`. Returns the source and
/// the 1-based line number of the first check.
fn c_source(
    minor: u8,
    checks: &[Check],
    line: impl Fn(usize, &Check) -> String,
) -> (String, usize) {
    let mut src = String::from("#include <stddef.h>\n");
    for h in headers(minor) {
        src.push_str(&format!("#include \"{h}\"\n"));
    }
    let first = src.lines().count() + 1;
    for (i, ch) in checks.iter().enumerate() {
        src.push_str(&line(i, ch));
        src.push('\n');
    }
    (src, first)
}

/// `cc -fsyntax-only` of `src` against one install's headers: (success, stderr).
fn compile(include: &Include, src: &str) -> (bool, String) {
    let mut child = Command::new("cc")
        .args(["-fsyntax-only", "-std=gnu11", "-DPy_BUILD_CORE", "-x", "c"])
        .arg("-I")
        .arg(&include.dir)
        .arg("-I")
        .arg(include.dir.join("internal"))
        .args(include.extra.iter().flat_map(|d| [Path::new("-I"), d]))
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cc");
    child
        .stdin
        .take()
        .expect("cc stdin")
        .write_all(src.as_bytes())
        .expect("write to cc");
    let out = child.wait_with_output().expect("wait for cc");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// After a failure: the headers' actual values, read from the compiler's warnings about
/// `char (*)[N]` initialised from `int *` (gcc and clang both print the type). One per check,
/// `None` where it could not be found.
fn actual_values(minor: u8, include: &Include, checks: &[Check]) -> Vec<Option<u64>> {
    let (src, first) = c_source(minor, checks, |i, ch| {
        format!("char (*spanprof_probe_{i})[{}] = (int *)0;", ch.expr)
    });
    let (_, stderr) = compile(include, &src);
    let mut found = vec![None; checks.len()];
    for msg in stderr.lines() {
        // "<stdin>:LINE:COL: warning: ... 'char (*)[N]' ..."
        let Some(line) = msg
            .strip_prefix("<stdin>:")
            .and_then(|r| r.split(':').next())
            .and_then(|l| l.parse::<usize>().ok())
        else {
            continue;
        };
        let Some(n) = msg
            .split_once("char (*)[")
            .and_then(|(_, r)| r.split(']').next())
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if let Some(slot) = line.checked_sub(first).and_then(|i| found.get_mut(i)) {
            *slot = Some(n);
        }
    }
    found
}

/// One install's headers of CPython 3.X.
struct Include {
    /// Where they come from, for messages.
    name: String,
    /// `include/python3.X`.
    dir: PathBuf,
    /// Further `-I` directories (Debian's multiarch `pyconfig.h`), kept alive with the check.
    extra: Vec<PathBuf>,
    _keep: Option<tempfile::TempDir>,
}

/// pyenv's header directories for 3.X, and the Debian sid rootfs's (`target/sid-rootfs`, made
/// by `cargo xtask test`) for the versions pyenv lacks.
fn includes(minor: u8) -> Vec<Include> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"));
    let prefix = format!("3.{minor}.");
    let mut found = Vec::new();
    if let Ok(dir) = std::fs::read_dir(root.join("versions")) {
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(patch) = name.strip_prefix(&prefix) else {
                continue;
            };
            let dir = entry.path().join(format!("include/python3.{minor}"));
            if patch.parse::<u32>().is_ok() && dir.join("Python.h").exists() {
                found.push(Include {
                    name,
                    dir,
                    extra: Vec::new(),
                    _keep: None,
                });
            }
        }
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    // Debian's pyconfig.h includes <x86_64-linux-gnu/python3.X/pyconfig.h>: a directory with
    // just that path, not the rootfs's whole /usr/include (its C library's headers are not
    // the host compiler's).
    let rootfs = manifest_dir().join("../target/sid-rootfs/usr/include");
    let dir = rootfs.join(format!("python3.{minor}"));
    let arch = rootfs.join(format!("x86_64-linux-gnu/python3.{minor}"));
    if found.is_empty() && dir.join("Python.h").exists() && arch.is_dir() {
        let keep = tempfile::tempdir().expect("temporary directory");
        std::fs::create_dir(keep.path().join("x86_64-linux-gnu")).expect("mkdir");
        std::os::unix::fs::symlink(
            &arch,
            keep.path()
                .join(format!("x86_64-linux-gnu/python3.{minor}")),
        )
        .expect("symlink");
        found.push(Include {
            name: format!("Debian sid's 3.{minor}"),
            dir,
            extra: vec![keep.path().to_owned()],
            _keep: Some(keep),
        });
    }
    found
}

#[test]
fn offsets_match_installed_headers() {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let mut failures = Vec::new();
    for table in offsets::ALL {
        let minor = table.version.1;
        let installs = includes(minor);
        if installs.is_empty() {
            assert!(
                !ci,
                "CPython 3.{minor} headers are missing under pyenv and in target/sid-rootfs"
            );
            eprintln!("note: no headers of 3.{minor}, its offsets are not checked");
            continue;
        }
        let mut checks = checks(table);
        checks.extend(object_checks(
            ObjectOffsets::for_version(3, minor).expect("an object table for every version"),
        ));
        let (src, _) = c_source(minor, &checks, |_, ch| {
            format!(
                "_Static_assert(({}) == {}, \"3.{minor} {}: {} != {}\");",
                ch.expr, ch.value, ch.field, ch.expr, ch.value
            )
        });
        for include in installs {
            let name = &include.name;
            let (ok, stderr) = compile(&include, &src);
            if ok {
                eprintln!("{name}: {} offsets match the headers", checks.len());
                continue;
            }
            let mut report = format!("{name} ({}):\n", include.dir.display());
            for (ch, actual) in checks.iter().zip(actual_values(minor, &include, &checks)) {
                if actual != Some(ch.value) {
                    let actual = actual.map_or("?".to_owned(), |a| a.to_string());
                    report.push_str(&format!(
                        "  {}: table {}, headers {actual} ({})\n",
                        ch.field, ch.value, ch.expr
                    ));
                }
            }
            report.push_str("  cc said:\n");
            for l in stderr.lines() {
                report.push_str(&format!("    {l}\n"));
            }
            failures.push(report);
        }
    }
    assert!(
        failures.is_empty(),
        "offsets disagree with the headers:\n{}",
        failures.join("\n")
    );
}
