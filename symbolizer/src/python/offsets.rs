//! Per-version CPython struct offsets (x86_64, default non-debug, GIL builds), only those a
//! frame walk and a code-object reader need.
//!
//! The values were taken from each version's installed headers (pyenv builds on the dev
//! machines, `include/python3.X/{cpython,internal}/*.h`) with `offsetof` under
//! `Py_BUILD_CORE`; each table names the headers. 3.13+ also publishes them at run time in
//! `_Py_DebugOffsets` ([`DebugOffsets`]), which a test compares with the 3.13 table.

/// How a thread state points at its innermost frame, and what a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameLayout {
    /// 3.8–3.10: `PyThreadState.frame` is a `PyFrameObject*`; `f_lasti` is an `int`.
    FrameObject {
        /// `f_lasti` counts code units (2 bytes) instead of bytes: 3.10.
        lasti_in_code_units: bool,
    },
    /// 3.11–3.12: `PyThreadState.cframe` → `_PyCFrame.current_frame` → `_PyInterpreterFrame`.
    CFrame {
        /// `offsetof(_PyCFrame, current_frame)`.
        current_frame: u64,
    },
    /// 3.13+: `PyThreadState.current_frame` is the `_PyInterpreterFrame*` itself.
    Direct,
}

/// How a thread state is matched with a kernel thread id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadIdMatch {
    /// 3.11+: `PyThreadState.native_thread_id` holds the kernel tid.
    NativeThreadId(u64),
    /// 3.8–3.10: only `PyThreadState.thread_id` (`pthread_self()`) exists. With glibc on
    /// x86_64 that is the address of the thread's `struct pthread`, whose `tid` field sits at
    /// [`GLIBC_PTHREAD_TID_OFFSET`]. (In BPF, `pthread_self()` equals the task's
    /// `thread.fsbase`, which needs no libc knowledge.)
    PthreadId,
}

/// Where the GIL's state (`struct _gil_runtime_state`) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GilAt {
    /// 3.8–3.11: in `_PyRuntime`, at `offsetof(_PyRuntimeState, ceval.gil)`.
    Runtime(u64),
    /// 3.12+: each interpreter points at the GIL it uses: `offsetof(PyInterpreterState,
    /// ceval.gil)` holds a `struct _gil_runtime_state *`.
    InterpreterPointer(u64),
}

/// `offsetof(struct _gil_runtime_state, last_holder)`: the `PyThreadState *` that holds or last
/// held the GIL (3.8–3.15, GIL builds: after `unsigned long interval`).
pub const GIL_LAST_HOLDER: u64 = 8;
/// `offsetof(struct _gil_runtime_state, locked)`: an `int`, 1 while a thread holds the GIL, 0
/// when free, -1 before it is created.
pub const GIL_LOCKED: u64 = 16;

/// `offsetof(struct _gil_runtime_state, switch_number)`: an `unsigned long` bumped at every
/// hand-over of the GIL.
pub const GIL_SWITCH_NUMBER: u64 = 24;

/// `offsetof(struct pthread, tid)` in glibc on x86_64 (nptl/descr.h; 720 since glibc 2.x and
/// measured on Debian 12's glibc 2.36). Not valid for musl.
pub const GLIBC_PTHREAD_TID_OFFSET: u64 = 720;

/// The lowest `_PyInterpreterFrame.owner` of a frame that is not a Python function: 3.12 and 3.13
/// push a shim frame owned by the C stack (`FRAME_OWNED_BY_CSTACK` = 3) when C code calls into
/// the interpreter; 3.14 numbers that one 4 and adds `FRAME_OWNED_BY_INTERPRETER` = 3 for the
/// base frame at the bottom of every thread's stack; 3.15 drops the C-stack owner and marks the
/// entry shim with the interpreter's (Include/internal/pycore_frame.h, 3.12–3.13;
/// pycore_interpframe_structs.h, 3.14–3.15). Every such frame (`owner >= 3`) ends one
/// interpreter call: the frame recorded before it is an entry frame.
pub const FRAME_OWNED_BY_SHIM: u8 = 3;

/// The low bits of a `_PyStackRef` (3.14+: `f_executable`) that tag it rather than address the
/// object (`Py_TAG_BITS`, 1 in GIL builds). Objects are at least 8-byte aligned, so clearing
/// three bits is right for every version, tagged or not.
pub const STACKREF_TAG_MASK: u64 = 7;

/// The offsets one CPython minor version needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyOffsets {
    /// (major, minor) this table is for.
    pub version: (u8, u8),
    /// `offsetof(_PyRuntimeState, interpreters.head)`.
    pub runtime_interpreters_head: u64,
    /// `offsetof(PyInterpreterState, tstate_head)` (≤3.10) or `threads.head` (3.11+).
    pub interp_threads_head: u64,
    /// `offsetof(PyThreadState, next)`.
    pub tstate_next: u64,
    /// Where the GIL's state is.
    pub gil: GilAt,
    /// `offsetof(PyThreadState, thread_id)` (`pthread_self()` of the thread).
    pub tstate_thread_id: u64,
    /// How to match a thread state with a kernel tid.
    pub thread_match: ThreadIdMatch,
    /// `offsetof(PyThreadState, frame | cframe | current_frame)`.
    pub tstate_frame: u64,
    /// What that field points to.
    pub frame_layout: FrameLayout,
    /// `f_back` / `previous`.
    pub frame_previous: u64,
    /// `f_code` / `f_executable`.
    pub frame_code: u64,
    /// `f_lasti` (`int`) / `prev_instr` / `instr_ptr` (pointers).
    pub frame_instr: u64,
    /// `offsetof(_PyInterpreterFrame, owner)` (a `char`), where shim frames exist (3.12+).
    pub frame_owner: Option<u64>,
    /// `offsetof(_PyInterpreterFrame, is_entry)` (a `bool`, 3.11 only): the frame was entered
    /// from C, so it is the outermost frame of its interpreter-loop call.
    pub frame_is_entry: Option<u64>,
    /// `offsetof(PyCodeObject, co_name)`.
    pub code_name: u64,
    /// `offsetof(PyCodeObject, co_qualname)`, 3.11+.
    pub code_qualname: Option<u64>,
    /// `offsetof(PyCodeObject, co_filename)`.
    pub code_filename: u64,
    /// `offsetof(PyCodeObject, co_firstlineno)` (`int`).
    pub code_firstlineno: u64,
    /// `co_lnotab` (3.8–3.9) or `co_linetable` (3.10+), a `bytes` object.
    pub code_linetable: u64,
    /// `offsetof(PyCodeObject, co_version)` (a `uint32_t`, 3.12+): a counter CPython bumps for
    /// every code object it creates, so a new object at a reused address differs.
    pub code_version: Option<u64>,
    /// `offsetof(PyCodeObject, co_code_adaptive)`: where the bytecode starts, 3.11+.
    pub code_adaptive: Option<u64>,
    /// `offsetof(PyASCIIObject, length)`.
    pub unicode_length: u64,
    /// `offsetof(PyASCIIObject, state)` (bit field: kind bits 2–4, compact bit 5, ascii bit 6
    /// in all of 3.8–3.13).
    pub unicode_state: u64,
    /// `sizeof(PyASCIIObject)`: data of a compact ASCII string follows it.
    pub unicode_ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: data of other compact strings follows it.
    pub unicode_compact_size: u64,
}

// Include/internal/pycore_pystate.h (_PyRuntimeState, PyInterpreterState),
// Include/cpython/pystate.h (PyThreadState), Include/frameobject.h, Include/code.h,
// Include/cpython/unicodeobject.h; v3.8.18.
const PY38: PyOffsets = PyOffsets {
    version: (3, 8),
    runtime_interpreters_head: 32,
    interp_threads_head: 8,
    tstate_next: 8,
    gil: GilAt::Runtime(1152),
    tstate_thread_id: 176,
    thread_match: ThreadIdMatch::PthreadId,
    tstate_frame: 24,
    frame_layout: FrameLayout::FrameObject {
        lasti_in_code_units: false,
    },
    frame_previous: 24,
    frame_code: 32,
    frame_instr: 104,
    frame_owner: None,
    frame_is_entry: None,
    code_name: 112,
    code_qualname: None,
    code_filename: 104,
    code_firstlineno: 40,
    code_linetable: 120,
    code_version: None,
    code_adaptive: None,
    unicode_length: 16,
    unicode_state: 32,
    unicode_ascii_size: 48,
    unicode_compact_size: 72,
};

// Include/internal/pycore_runtime.h (_PyRuntimeState), Include/internal/pycore_interp.h
// (PyInterpreterState), Include/cpython/pystate.h, Include/cpython/frameobject.h,
// Include/cpython/code.h, Include/cpython/unicodeobject.h; v3.9.18.
const PY39: PyOffsets = PyOffsets {
    version: (3, 9),
    gil: GilAt::Runtime(352),
    ..PY38
};

// Include/internal/pycore_runtime.h, Include/internal/pycore_interp.h,
// Include/cpython/pystate.h, Include/cpython/frameobject.h (f_lasti now counts code units),
// Include/cpython/code.h (co_linetable replaces co_lnotab), Include/cpython/unicodeobject.h;
// v3.10.13.
const PY310: PyOffsets = PyOffsets {
    version: (3, 10),
    gil: GilAt::Runtime(352),
    frame_layout: FrameLayout::FrameObject {
        lasti_in_code_units: true,
    },
    frame_instr: 96,
    ..PY38
};

// Include/internal/pycore_runtime.h, Include/internal/pycore_interp.h (threads.head),
// Include/cpython/pystate.h (cframe, native_thread_id), Include/internal/pycore_frame.h
// (_PyInterpreterFrame: f_code, previous, prev_instr), Include/cpython/code.h,
// Include/cpython/unicodeobject.h; v3.11.7.
const PY311: PyOffsets = PyOffsets {
    version: (3, 11),
    runtime_interpreters_head: 40,
    interp_threads_head: 16,
    tstate_next: 8,
    gil: GilAt::Runtime(360),
    tstate_thread_id: 152,
    thread_match: ThreadIdMatch::NativeThreadId(160),
    tstate_frame: 56,
    frame_layout: FrameLayout::CFrame { current_frame: 8 },
    frame_previous: 48,
    frame_code: 32,
    frame_instr: 56,
    // NB: 3.11 has `owner` at 69 but no C-stack shim frames (entry frames are flagged with
    // `is_entry` and are real Python frames), so nothing is skipped.
    frame_owner: None,
    frame_is_entry: Some(68),
    code_name: 120,
    code_qualname: Some(128),
    code_filename: 112,
    code_firstlineno: 72,
    code_linetable: 136,
    code_version: None,
    code_adaptive: Some(184),
    unicode_length: 16,
    unicode_state: 32,
    unicode_ascii_size: 48,
    unicode_compact_size: 72,
};

// Include/internal/pycore_runtime.h, Include/internal/pycore_interp.h,
// Include/cpython/pystate.h (cframe), Include/internal/pycore_frame.h (f_code, previous,
// prev_instr, owner), Include/cpython/code.h, Include/cpython/unicodeobject.h (wstr gone:
// smaller string headers); v3.12.1.
const PY312: PyOffsets = PyOffsets {
    version: (3, 12),
    runtime_interpreters_head: 40,
    interp_threads_head: 72,
    tstate_next: 8,
    gil: GilAt::InterpreterPointer(384),
    tstate_thread_id: 136,
    thread_match: ThreadIdMatch::NativeThreadId(144),
    tstate_frame: 56,
    frame_layout: FrameLayout::CFrame { current_frame: 0 },
    frame_previous: 8,
    frame_code: 0,
    frame_instr: 56,
    frame_owner: Some(70),
    frame_is_entry: None,
    code_name: 120,
    code_qualname: Some(128),
    code_filename: 112,
    code_firstlineno: 68,
    code_linetable: 136,
    code_version: Some(92),
    code_adaptive: Some(192),
    unicode_length: 16,
    unicode_state: 32,
    unicode_ascii_size: 40,
    unicode_compact_size: 56,
};

// Include/internal/pycore_runtime.h (_PyRuntimeState, _Py_DebugOffsets),
// Include/internal/pycore_interp.h, Include/cpython/pystate.h (current_frame),
// Include/internal/pycore_frame.h (f_executable, previous, instr_ptr, owner),
// Include/cpython/code.h, Include/cpython/unicodeobject.h; v3.13.0.
const PY313: PyOffsets = PyOffsets {
    version: (3, 13),
    runtime_interpreters_head: 632,
    interp_threads_head: 7344,
    tstate_next: 8,
    gil: GilAt::InterpreterPointer(16),
    tstate_thread_id: 152,
    thread_match: ThreadIdMatch::NativeThreadId(160),
    tstate_frame: 72,
    frame_layout: FrameLayout::Direct,
    frame_previous: 8,
    frame_code: 0,
    frame_instr: 56,
    frame_owner: Some(70),
    frame_is_entry: None,
    code_name: 120,
    code_qualname: Some(128),
    code_filename: 112,
    code_firstlineno: 68,
    code_linetable: 136,
    code_version: Some(92),
    code_adaptive: Some(200),
    unicode_length: 16,
    unicode_state: 32,
    unicode_ascii_size: 40,
    unicode_compact_size: 56,
};

// Include/internal/pycore_runtime_structs.h, pycore_interp_structs.h, Include/cpython/pystate.h,
// Include/internal/pycore_interpframe_structs.h (f_executable is a tagged _PyStackRef; the
// owner moved to 74 after return_offset), Include/cpython/code.h; Debian sid's 3.14.10
// (libpython3.14-dev), the same in the runtime's _Py_DebugOffsets.
const PY314: PyOffsets = PyOffsets {
    version: (3, 14),
    runtime_interpreters_head: 808,
    interp_threads_head: 7344,
    frame_owner: Some(74),
    code_adaptive: Some(208),
    ..PY313
};

// As 3.14 (Debian sid's 3.15.2, libpython3.15-dev): PyThreadState gained fields before
// thread_id; the frame and code layouts are 3.14's.
const PY315: PyOffsets = PyOffsets {
    version: (3, 15),
    runtime_interpreters_head: 936,
    interp_threads_head: 7336,
    tstate_thread_id: 176,
    thread_match: ThreadIdMatch::NativeThreadId(184),
    ..PY314
};

/// Every supported table.
pub const ALL: [&PyOffsets; 8] = [&PY38, &PY39, &PY310, &PY311, &PY312, &PY313, &PY314, &PY315];

/// The newest supported minor version of CPython 3.
pub const NEWEST_MINOR: u8 = 15;

/// The table for CPython `major.minor`, if supported.
pub fn for_version(major: u8, minor: u8) -> Option<&'static PyOffsets> {
    ALL.iter().copied().find(|o| o.version == (major, minor))
}

/// `_Py_Debug_Cookie` (Include/internal/pycore_runtime.h, 3.13; pycore_debug_offsets.h, 3.14+).
pub const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// Where the fields [`DebugOffsets`] keeps sit in one version's `_Py_DebugOffsets`: word
/// (`uint64_t`) indices from the start of the struct, whose layout is `char cookie[8];
/// uint64_t version; uint64_t free_threaded;` then nested structs of `uint64_t`, each starting
/// with `size`. The layout is the same in free-threaded and debug builds of a version (no field
/// is conditional), so [`DebugOffsets::free_threaded`] can be read from any build.
struct DebugLayout {
    minor: u8,
    /// Words in the whole struct.
    words: usize,
    /// runtime interpreters_head, interp threads_head, tstate next, current_frame, thread_id,
    /// native_thread_id, frame previous, executable, instr_ptr, owner, code filename, name,
    /// qualname, linetable, firstlineno, co_code_adaptive, unicode state, length,
    /// asciiobject_size.
    at: [usize; 19],
}

/// The `_Py_DebugOffsets` layouts known here, from each version's headers (3.13.0; sid's
/// 3.14.10 and 3.15.2 `pycore_debug_offsets.h`, with `offsetof` under `Py_BUILD_CORE`).
const DEBUG_LAYOUTS: [DebugLayout; 3] = [
    // runtime_state 3..=5, interpreter_state 6..=18, thread_state 19..=27,
    // interpreter_frame 28..=33, code_object 34..=43, …, unicode 67..=70, gc 71..=72.
    DebugLayout {
        minor: 13,
        words: 73,
        at: [
            5, 9, 21, 23, 24, 25, 29, 30, 31, 33, 35, 36, 37, 38, 39, 43, 68, 69, 70,
        ],
    },
    // interpreter_state 6..=21 (gc, gil, code_object_generation…), thread_state 22..=30,
    // interpreter_frame 31..=38, code_object 39..=49, …, unicode 77..=80, … 95 words.
    DebugLayout {
        minor: 14,
        words: 95,
        at: [
            5, 9, 24, 26, 27, 28, 32, 33, 34, 36, 40, 41, 42, 43, 44, 48, 78, 79, 80,
        ],
    },
    // thread_state 22..=37 (base_frame, last_profiled_frame… before thread_id), err_stackitem
    // 38, interpreter_frame 39..=46, code_object 47..=57, …, unicode 89..=92, … 111 words.
    DebugLayout {
        minor: 15,
        words: 111,
        at: [
            5, 9, 24, 26, 30, 31, 40, 41, 42, 44, 48, 49, 50, 51, 52, 56, 90, 91, 92,
        ],
    },
];

/// Bytes read from the start of `_PyRuntime` to parse [`DebugOffsets`]: the largest layout
/// known (3.15's 111 words); `_PyRuntime` is far larger, so the read never runs off it.
pub const DEBUG_OFFSETS_LEN: usize = 111 * 8;

/// The fields of `_Py_DebugOffsets` (3.13+) that [`PyOffsets`] also carries, and the build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebugOffsets {
    /// `PY_VERSION_HEX` of the runtime.
    pub version_hex: u64,
    /// Non-zero on free-threaded builds.
    pub free_threaded: u64,
    /// `runtime_state.interpreters_head`.
    pub runtime_interpreters_head: u64,
    /// `interpreter_state.threads_head`.
    pub interp_threads_head: u64,
    /// `thread_state.next`.
    pub tstate_next: u64,
    /// `thread_state.current_frame`.
    pub tstate_current_frame: u64,
    /// `thread_state.thread_id`.
    pub tstate_thread_id: u64,
    /// `thread_state.native_thread_id`.
    pub tstate_native_thread_id: u64,
    /// `interpreter_frame.previous`.
    pub frame_previous: u64,
    /// `interpreter_frame.executable`.
    pub frame_executable: u64,
    /// `interpreter_frame.instr_ptr`.
    pub frame_instr_ptr: u64,
    /// `interpreter_frame.owner`.
    pub frame_owner: u64,
    /// `code_object.filename`.
    pub code_filename: u64,
    /// `code_object.name`.
    pub code_name: u64,
    /// `code_object.qualname`.
    pub code_qualname: u64,
    /// `code_object.linetable`.
    pub code_linetable: u64,
    /// `code_object.firstlineno`.
    pub code_firstlineno: u64,
    /// `code_object.co_code_adaptive`.
    pub code_adaptive: u64,
    /// `unicode_object.state`.
    pub unicode_state: u64,
    /// `unicode_object.length`.
    pub unicode_length: u64,
    /// `unicode_object.asciiobject_size`.
    pub unicode_ascii_size: u64,
}

/// Why `_Py_DebugOffsets` could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DebugOffsetsError {
    /// Fewer bytes than the struct.
    #[error("debug offsets need {need} bytes, got {got}")]
    Short { need: usize, got: usize },
    /// No `xdebugpy` cookie: not 3.13+, or not `_PyRuntime`.
    #[error("no _Py_DebugOffsets cookie")]
    NoCookie,
    /// A version whose layout is not known here.
    #[error("unsupported _Py_DebugOffsets layout for version {0:#x}")]
    UnsupportedVersion(u64),
    /// The `runtime_state.size` word is smaller than the struct itself: not a `_PyRuntime` of
    /// that version (garbage, or a build whose struct is not the one its version says).
    #[error("_Py_DebugOffsets of version {0:#x} is not laid out as that version's headers say")]
    Layout(u64),
    /// A field disagrees with the compiled-in table.
    #[error("{field}: runtime says {runtime}, table says {table}")]
    Mismatch {
        field: &'static str,
        runtime: u64,
        table: u64,
    },
}

impl DebugOffsets {
    /// Parses the start of `_PyRuntime` of a 3.13+ process, by the layout of the version the
    /// struct names.
    pub fn parse(bytes: &[u8]) -> Result<Self, DebugOffsetsError> {
        if bytes.len() < 16 {
            return Err(DebugOffsetsError::Short {
                need: 16,
                got: bytes.len(),
            });
        }
        if &bytes[..8] != DEBUG_COOKIE {
            return Err(DebugOffsetsError::NoCookie);
        }
        let w = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        let version_hex = w(1);
        let layout = DEBUG_LAYOUTS
            .iter()
            .find(|l| version_hex >> 16 == 0x0300 | u64::from(l.minor))
            .ok_or(DebugOffsetsError::UnsupportedVersion(version_hex))?;
        if bytes.len() < layout.words * 8 {
            return Err(DebugOffsetsError::Short {
                need: layout.words * 8,
                got: bytes.len(),
            });
        }
        // The runtime_state part starts at word 3 with its own size: sizeof(_PyRuntimeState),
        // which is far larger than the debug offsets themselves. The fields are then checked
        // one by one against a table ([`DebugOffsets::check`]).
        if w(3) < (layout.words * 8) as u64 {
            return Err(DebugOffsetsError::Layout(version_hex));
        }
        let a = layout.at;
        Ok(Self {
            version_hex,
            free_threaded: w(2),
            runtime_interpreters_head: w(a[0]),
            interp_threads_head: w(a[1]),
            tstate_next: w(a[2]),
            tstate_current_frame: w(a[3]),
            tstate_thread_id: w(a[4]),
            tstate_native_thread_id: w(a[5]),
            frame_previous: w(a[6]),
            frame_executable: w(a[7]),
            frame_instr_ptr: w(a[8]),
            frame_owner: w(a[9]),
            code_filename: w(a[10]),
            code_name: w(a[11]),
            code_qualname: w(a[12]),
            code_linetable: w(a[13]),
            code_firstlineno: w(a[14]),
            code_adaptive: w(a[15]),
            unicode_state: w(a[16]),
            unicode_length: w(a[17]),
            unicode_ascii_size: w(a[18]),
        })
    }

    /// `(major, minor)` of the runtime.
    pub fn version(&self) -> (u8, u8) {
        (
            (self.version_hex >> 24) as u8,
            (self.version_hex >> 16) as u8,
        )
    }

    /// Checks every shared field against a compiled-in table.
    pub fn check(&self, table: &PyOffsets) -> Result<(), DebugOffsetsError> {
        let native = match table.thread_match {
            ThreadIdMatch::NativeThreadId(o) => o,
            ThreadIdMatch::PthreadId => u64::MAX,
        };
        let pairs: [(&'static str, u64, u64); 20] = [
            // Free-threaded builds lay objects out differently; no table covers them yet.
            ("free_threaded", self.free_threaded, 0),
            (
                "runtime.interpreters_head",
                self.runtime_interpreters_head,
                table.runtime_interpreters_head,
            ),
            (
                "interp.threads_head",
                self.interp_threads_head,
                table.interp_threads_head,
            ),
            ("tstate.next", self.tstate_next, table.tstate_next),
            (
                "tstate.current_frame",
                self.tstate_current_frame,
                table.tstate_frame,
            ),
            (
                "tstate.thread_id",
                self.tstate_thread_id,
                table.tstate_thread_id,
            ),
            (
                "tstate.native_thread_id",
                self.tstate_native_thread_id,
                native,
            ),
            ("frame.previous", self.frame_previous, table.frame_previous),
            ("frame.executable", self.frame_executable, table.frame_code),
            ("frame.instr_ptr", self.frame_instr_ptr, table.frame_instr),
            (
                "frame.owner",
                self.frame_owner,
                table.frame_owner.unwrap_or(u64::MAX),
            ),
            ("code.filename", self.code_filename, table.code_filename),
            ("code.name", self.code_name, table.code_name),
            (
                "code.qualname",
                self.code_qualname,
                table.code_qualname.unwrap_or(u64::MAX),
            ),
            ("code.linetable", self.code_linetable, table.code_linetable),
            (
                "code.firstlineno",
                self.code_firstlineno,
                table.code_firstlineno,
            ),
            (
                "code.co_code_adaptive",
                self.code_adaptive,
                table.code_adaptive.unwrap_or(u64::MAX),
            ),
            ("unicode.state", self.unicode_state, table.unicode_state),
            ("unicode.length", self.unicode_length, table.unicode_length),
            (
                "unicode.asciiobject_size",
                self.unicode_ascii_size,
                table.unicode_ascii_size,
            ),
        ];
        for (field, runtime, table) in pairs {
            if runtime != table {
                return Err(DebugOffsetsError::Mismatch {
                    field,
                    runtime,
                    table,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_version_has_one_table() {
        for minor in 8..=NEWEST_MINOR {
            assert_eq!(for_version(3, minor).map(|o| o.version), Some((3, minor)));
        }
        assert!(for_version(3, 7).is_none());
        assert!(for_version(3, NEWEST_MINOR + 1).is_none());
    }

    #[test]
    fn debug_offsets_reject_garbage() {
        assert_eq!(
            DebugOffsets::parse(&[0; 8]),
            Err(DebugOffsetsError::Short { need: 16, got: 8 })
        );
        assert_eq!(
            DebugOffsets::parse(&[0; DEBUG_OFFSETS_LEN]),
            Err(DebugOffsetsError::NoCookie)
        );
        let mut b = vec![0u8; DEBUG_OFFSETS_LEN];
        b[..8].copy_from_slice(DEBUG_COOKIE);
        b[8..16].copy_from_slice(&0x0310_00f0u64.to_le_bytes());
        assert_eq!(
            DebugOffsets::parse(&b),
            Err(DebugOffsetsError::UnsupportedVersion(0x0310_00f0))
        );
        // A 3.14 header with the rest zero: its runtime_state size is not plausible.
        b[8..16].copy_from_slice(&0x030e_0af0u64.to_le_bytes());
        assert_eq!(
            DebugOffsets::parse(&b[..100 * 8]),
            Err(DebugOffsetsError::Layout(0x030e_0af0))
        );
        assert_eq!(
            DebugOffsets::parse(&b[..90 * 8]),
            Err(DebugOffsetsError::Short {
                need: 95 * 8,
                got: 90 * 8
            })
        );
    }

    /// A `_Py_DebugOffsets` as version 3.`minor`'s runtime would publish it for `table`.
    fn publish(minor: u8, table: &PyOffsets, free_threaded: u64) -> Vec<u8> {
        let layout = DEBUG_LAYOUTS.iter().find(|l| l.minor == minor).unwrap();
        let mut b = vec![0u8; DEBUG_OFFSETS_LEN];
        b[..8].copy_from_slice(DEBUG_COOKIE);
        let mut put =
            |word: usize, v: u64| b[word * 8..word * 8 + 8].copy_from_slice(&v.to_le_bytes());
        put(1, 0x0300_0000 | u64::from(minor) << 16 | 0x0af0);
        put(2, free_threaded);
        put(3, 4096); // sizeof(_PyRuntimeState)
        let native = match table.thread_match {
            ThreadIdMatch::NativeThreadId(o) => o,
            ThreadIdMatch::PthreadId => unreachable!(),
        };
        let values = [
            table.runtime_interpreters_head,
            table.interp_threads_head,
            table.tstate_next,
            table.tstate_frame,
            table.tstate_thread_id,
            native,
            table.frame_previous,
            table.frame_code,
            table.frame_instr,
            table.frame_owner.unwrap(),
            table.code_filename,
            table.code_name,
            table.code_qualname.unwrap(),
            table.code_linetable,
            table.code_firstlineno,
            table.code_adaptive.unwrap(),
            table.unicode_state,
            table.unicode_length,
            table.unicode_ascii_size,
        ];
        for (word, v) in layout.at.iter().zip(values) {
            put(*word, v);
        }
        b
    }

    #[test]
    fn debug_offsets_of_each_layout_round_trip_and_name_free_threaded_builds() {
        for minor in 13..=NEWEST_MINOR {
            let table = for_version(3, minor).unwrap();
            let d = DebugOffsets::parse(&publish(minor, table, 0)).unwrap();
            assert_eq!(d.version(), (3, minor));
            assert_eq!(d.check(table), Ok(()), "3.{minor}");
            // A free-threaded build says so, and is never checked as a GIL build's.
            let d = DebugOffsets::parse(&publish(minor, table, 1)).unwrap();
            assert_eq!(d.free_threaded, 1);
            assert!(matches!(
                d.check(table),
                Err(DebugOffsetsError::Mismatch {
                    field: "free_threaded",
                    ..
                })
            ));
            // Another version's table does not pass for this one.
            let other = for_version(3, if minor == 13 { 14 } else { 13 }).unwrap();
            assert!(d.check(other).is_err());
        }
    }
}
