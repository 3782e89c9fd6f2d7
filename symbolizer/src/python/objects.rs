//! Reading Python objects of a live process from user space, to find what the BPF program needs
//! to read span contexts: the objects of OpenTelemetry and OSProfiler (modules, the
//! `current_context` ContextVar, the span key, interned attribute names, OSProfiler's
//! `threading.local`, the interned `_name` that spans and trace points keep their names under)
//! and the offsets of the version.
//!
//! # Overview
//! [`ObjectOffsets::for_version`] gives the layouts (3.8–3.13), checked against each version's
//! headers like [`super::offsets`]. [`Objects`] follows them through any
//! [`ProcessMemory`]: dict entries, instance attributes (a dict at `tp_dictoffset` before 3.11,
//! managed dicts and values from 3.11), strs, tuples, a function's `co_names`.
//! [`SpanFinder`] looks for the tracing libraries in `sys.modules`, incrementally: a process
//! that has not imported them yet costs two reads per look.
//!
//! # Design constraints
//! The process runs while it is read: every object is validated (type names, str contents,
//! bounded sizes) and a failure only means "not found yet"; the BPF side compares objects by
//! identity, so an address found here is either right or matches nothing.

use super::memory::{MemError, ProcessMemory};
use super::offsets::PyOffsets;
use super::walk::{read_str, TypeAddrs};

/// How a dict's keys object is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DictLayout {
    /// 3.8–3.10: `dk_size`, `dk_nentries` at 32, indices at 40, 24-byte entries.
    Size,
    /// 3.11+: `dk_log2_size`, `dk_log2_index_bytes`, `dk_kind`, `dk_nentries` at 24,
    /// indices at 32, 16-byte entries for str-only tables.
    Log2,
}

/// Where an instance's attributes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrLayout {
    /// A dict at the type's `tp_dictoffset` (3.8–3.10).
    DictOffset,
    /// 3.11: a dict at obj-24, or values at obj-32 (keys: the type's `ht_cached_keys`).
    Managed,
    /// 3.12: obj-24 holds a dict, or the values' address minus one (the low bit set).
    Tagged,
    /// 3.13: a dict at obj-24, or the values inline at `tp_basicsize`.
    Inline,
}

/// Offsets of the objects span reading goes through, for one CPython minor version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectOffsets {
    /// (major, minor).
    pub version: (u8, u8),
    /// `offsetof(PyInterpreterState, modules)` (`imports.modules` from 3.12).
    pub interp_modules: u64,
    /// `offsetof(PyThreadState, context)`.
    pub tstate_context: u64,
    /// `offsetof(PyThreadState, dict)`.
    pub tstate_dict: u64,
    /// `offsetof(PyThreadState, threading_local_key)` (3.13).
    pub tstate_local_key: Option<u64>,
    /// `offsetof(PyContext, ctx_vars)`.
    pub context_vars: u64,
    /// `offsetof(PyHamtObject, h_root)`.
    pub hamt_root: u64,
    /// `offsetof(PyContextVar, var_hash)`.
    pub contextvar_hash: u64,
    /// `offsetof(PyDictObject, ma_keys)`; `ma_values` follows.
    pub dict_keys: u64,
    /// Keys layout.
    pub dict_layout: DictLayout,
    /// Offset of `values[0]` in a split dict's values (`PyDictValues.values` on 3.13).
    pub dict_values: u64,
    /// Instance attributes.
    pub attr_layout: AttrLayout,
    /// `offsetof(PyTypeObject, tp_name)`.
    pub type_name: u64,
    /// `offsetof(PyTypeObject, tp_basicsize)`.
    pub type_basicsize: u64,
    /// `offsetof(PyTypeObject, tp_flags)`.
    pub type_flags: u64,
    /// `offsetof(PyTypeObject, tp_dict)`.
    pub type_dict: u64,
    /// `offsetof(PyTypeObject, tp_dictoffset)`.
    pub type_dictoffset: u64,
    /// `offsetof(PyHeapTypeObject, ht_cached_keys)`.
    pub type_cached_keys: u64,
    /// A PyLong's size is `lv_tag` (3.12+), not `ob_size`.
    pub long_tag: bool,
    /// `offsetof(PyFunctionObject, func_code)`.
    pub func_code: u64,
    /// `offsetof(PyCodeObject, co_names)`.
    pub code_names: u64,
    /// `offsetof(localobject, key)` (Modules/_threadmodule.c, ≤3.12).
    pub local_key: Option<u64>,
    /// `offsetof(localobject, localdicts)` (3.13).
    pub local_dicts: Option<u64>,
    /// `offsetof(PyTupleObject, ob_item)`: 3.14 put the cached `ob_hash` before the items.
    pub tuple_items: u64,
}

/// `Py_TPFLAGS_INLINE_VALUES` (3.13).
pub const TPFLAGS_INLINE_VALUES: u64 = 1 << 2;
/// `Py_TPFLAGS_MANAGED_DICT` (3.11+).
pub const TPFLAGS_MANAGED_DICT: u64 = 1 << 4;
/// `offsetof(PyObject, ob_type)`.
const OB_TYPE: u64 = 8;
/// `offsetof(PyVarObject, ob_size)`; a PyLong's `lv_tag` (3.12+) is there too.
pub(super) const OB_SIZE: u64 = 16;
/// `offsetof(PyModuleObject, md_dict)` (Objects/moduleobject.c, 3.8–3.13).
const MODULE_DICT: u64 = 16;
/// `offsetof(PyASCIIObject, hash)`.
const STR_HASH: u64 = 24;
/// Entries read from one dict at most: sys.modules of a big service has a few thousand.
const MAX_DICT_ENTRIES: u64 = 1 << 15;
/// Items read from one tuple at most (`co_names` of a long function).
const MAX_TUPLE_ITEMS: u64 = 4096;

// Include/internal/pycore_interp.h, Include/cpython/pystate.h, Include/internal/pycore_context.h,
// Include/internal/pycore_hamt.h, Include/internal/pycore_dict.h (Objects/dict-common.h
// before 3.11), Include/cpython/object.h, Include/cpython/funcobject.h, Include/cpython/code.h,
// Modules/_threadmodule.c of each version.
const COMMON: ObjectOffsets = ObjectOffsets {
    version: (3, 0),
    interp_modules: 0,
    tstate_context: 0,
    tstate_dict: 0,
    tstate_local_key: None,
    context_vars: 24,
    hamt_root: 16,
    contextvar_hash: 56,
    dict_keys: 32,
    dict_layout: DictLayout::Size,
    dict_values: 0,
    attr_layout: AttrLayout::DictOffset,
    type_name: 24,
    type_basicsize: 32,
    type_flags: 168,
    type_dict: 264,
    type_dictoffset: 288,
    type_cached_keys: 872,
    long_tag: false,
    func_code: 16,
    code_names: 64,
    local_key: Some(16),
    local_dicts: None,
    tuple_items: 24,
};

/// 3.13, which 3.14 and 3.15 build on.
const PY313_OBJECTS: ObjectOffsets = ObjectOffsets {
    version: (3, 13),
    interp_modules: 7656,
    tstate_context: 208,
    tstate_dict: 128,
    tstate_local_key: Some(288),
    dict_layout: DictLayout::Log2,
    dict_values: 8,
    attr_layout: AttrLayout::Inline,
    type_cached_keys: 880,
    long_tag: true,
    func_code: 48,
    code_names: 32,
    local_key: None,
    local_dicts: Some(40),
    ..COMMON
};

const TABLES: [ObjectOffsets; 8] = [
    ObjectOffsets {
        version: (3, 8),
        interp_modules: 56,
        tstate_context: 240,
        tstate_dict: 152,
        ..COMMON
    },
    ObjectOffsets {
        version: (3, 9),
        interp_modules: 856,
        tstate_context: 240,
        tstate_dict: 152,
        type_cached_keys: 864,
        ..COMMON
    },
    ObjectOffsets {
        version: (3, 10),
        interp_modules: 856,
        tstate_context: 240,
        tstate_dict: 152,
        func_code: 48,
        ..COMMON
    },
    ObjectOffsets {
        version: (3, 11),
        interp_modules: 888,
        tstate_context: 224,
        tstate_dict: 128,
        dict_layout: DictLayout::Log2,
        attr_layout: AttrLayout::Managed,
        func_code: 48,
        code_names: 32,
        ..COMMON
    },
    ObjectOffsets {
        version: (3, 12),
        interp_modules: 944,
        tstate_context: 208,
        tstate_dict: 112,
        dict_layout: DictLayout::Log2,
        attr_layout: AttrLayout::Tagged,
        type_cached_keys: 880,
        long_tag: true,
        func_code: 48,
        code_names: 32,
        ..COMMON
    },
    PY313_OBJECTS,
    // Debian sid's 3.14.10 headers (pycore_interp_structs.h moved PyInterpreterState); the
    // object layouts are 3.13's, but tuples cache their hash before their items.
    ObjectOffsets {
        version: (3, 14),
        interp_modules: 7688,
        tuple_items: 32,
        ..PY313_OBJECTS
    },
    // Debian sid's 3.15.2 headers: PyThreadState and PyHeapTypeObject grew.
    ObjectOffsets {
        version: (3, 15),
        interp_modules: 7592,
        tstate_context: 232,
        tstate_dict: 152,
        tstate_local_key: Some(328),
        type_cached_keys: 888,
        tuple_items: 32,
        ..PY313_OBJECTS
    },
];

impl ObjectOffsets {
    /// The table of a version, if supported.
    pub fn for_version(major: u8, minor: u8) -> Option<&'static ObjectOffsets> {
        TABLES.iter().find(|t| t.version == (major, minor))
    }
}

/// Why an object could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// A read failed.
    #[error(transparent)]
    Mem(#[from] MemError),
    /// A value was not what it should be (a freed or changing object, or another library).
    #[error("unexpected {0}")]
    Invalid(&'static str),
}

pub(super) type Result<T> = std::result::Result<T, ObjectError>;

/// A reader of Python objects in a process.
#[derive(Debug)]
pub struct Objects<'a, M> {
    /// The process.
    pub mem: &'a M,
    /// Frame-walk offsets of the version (str layout).
    pub py: &'static PyOffsets,
    /// Object offsets of the version.
    pub obj: &'static ObjectOffsets,
}

impl<M: ProcessMemory> Objects<'_, M> {
    pub(super) fn ptr(&self, addr: u64) -> Result<u64> {
        Ok(self.mem.read_ptr(addr)?)
    }

    /// The `tp_name` of an object's type (at most 64 bytes).
    pub fn type_name(&self, obj: u64) -> Result<String> {
        let ty = self.ptr(obj.wrapping_add(OB_TYPE))?;
        let name = self.ptr(ty.wrapping_add(self.obj.type_name))?;
        let mut buf = [0u8; 64];
        // The name may sit at the end of a mapping: read less rather than fail.
        let mut len = buf.len();
        while self.mem.read(name, &mut buf[..len]).is_err() {
            len /= 2;
            if len < 8 {
                return Err(ObjectError::Invalid("type name"));
            }
        }
        let end = buf[..len].iter().position(|&b| b == 0).unwrap_or(len);
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    /// A compact str's text.
    pub fn str(&self, obj: u64) -> Result<String> {
        read_str(self.mem, self.py, TypeAddrs::default(), obj)
            .map_err(|_| ObjectError::Invalid("str"))
    }

    /// A str's cached hash (`-1` when never computed: such a str keys no dict).
    pub fn str_hash(&self, obj: u64) -> Result<u64> {
        let h = self.mem.read_u64(obj.wrapping_add(STR_HASH))?;
        if h as i64 == -1 {
            return Err(ObjectError::Invalid("str hash not computed"));
        }
        Ok(h)
    }

    /// The (key, value) pairs of a keys object, with split `values` (0: combined table).
    pub fn keys_entries(&self, keys: u64, values: u64) -> Result<Vec<(u64, u64)>> {
        let mut entries = self.keys_slots(keys, values)?;
        entries.retain(|&(k, v)| k != 0 && v != 0);
        Ok(entries)
    }

    /// Every entry slot of a keys object, deleted ones included (as zeros).
    fn keys_slots(&self, keys: u64, values: u64) -> Result<Vec<(u64, u64)>> {
        let mut hdr = [0u8; 40];
        self.mem.read(keys, &mut hdr)?;
        let u64_at = |o: usize| u64::from_le_bytes(hdr[o..o + 8].try_into().unwrap());
        let (nentries, entries, esize, koff) = match self.obj.dict_layout {
            DictLayout::Size => {
                let size = u64_at(8);
                if !size.is_power_of_two() || !(8..=1 << 30).contains(&size) {
                    return Err(ObjectError::Invalid("dict size"));
                }
                let width = match size {
                    0..=0xff => 1,
                    0x100..=0xffff => 2,
                    _ => 4,
                };
                (u64_at(32), keys + 40 + size * width, 24u64, 8u64)
            }
            DictLayout::Log2 => {
                let (log2, log2_index, kind) = (hdr[8], hdr[9], hdr[10]);
                if !(3..=30).contains(&log2) || log2_index < log2 || log2_index > log2 + 3 {
                    return Err(ObjectError::Invalid("dict size"));
                }
                let general = kind == 0;
                (
                    u64_at(24),
                    keys + 32 + (1u64 << log2_index),
                    if general { 24 } else { 16 },
                    if general { 8 } else { 0 },
                )
            }
        };
        if nentries > MAX_DICT_ENTRIES {
            return Err(ObjectError::Invalid("dict entries"));
        }
        let mut raw = vec![0u8; (nentries * esize) as usize];
        self.mem.read(entries, &mut raw)?;
        let mut vals = vec![
            0u8;
            if values != 0 {
                nentries as usize * 8
            } else {
                0
            }
        ];
        if values != 0 {
            self.mem
                .read(values.wrapping_add(self.obj.dict_values), &mut vals)?;
        }
        let word = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        Ok((0..nentries as usize)
            .map(|i| {
                let e = i * esize as usize + koff as usize;
                let value = if values != 0 {
                    word(&vals, i * 8)
                } else {
                    word(&raw, e + 8)
                };
                (word(&raw, e), value)
            })
            .collect())
    }

    /// The (key, value) pairs of a dict (or a dict subclass instance).
    pub fn dict_entries(&self, dict: u64) -> Result<Vec<(u64, u64)>> {
        let keys = self.ptr(dict.wrapping_add(self.obj.dict_keys))?;
        let values = self.ptr(dict.wrapping_add(self.obj.dict_keys + 8))?;
        self.keys_entries(keys, values)
    }

    /// The value under the str key `name` in a dict, with the key object.
    pub fn dict_get(&self, dict: u64, name: &str) -> Result<Option<(u64, u64)>> {
        Ok(self.find_str_key(self.dict_entries(dict)?, name))
    }

    pub(super) fn find_str_key(&self, entries: Vec<(u64, u64)>, name: &str) -> Option<(u64, u64)> {
        entries
            .into_iter()
            .find(|&(k, _)| self.str(k).is_ok_and(|s| s == name))
    }

    /// The instance attributes of `obj`, as (name str, value) pairs.
    pub fn attrs(&self, obj: u64) -> Result<Vec<(u64, u64)>> {
        let ty = self.ptr(obj.wrapping_add(OB_TYPE))?;
        let flags = self.mem.read_u64(ty.wrapping_add(self.obj.type_flags))?;
        let layout = if flags & TPFLAGS_MANAGED_DICT == 0 {
            AttrLayout::DictOffset
        } else {
            self.obj.attr_layout
        };
        let cached = || self.ptr(ty.wrapping_add(self.obj.type_cached_keys));
        match layout {
            AttrLayout::DictOffset => {
                let off = self
                    .mem
                    .read_u64(ty.wrapping_add(self.obj.type_dictoffset))?
                    as i64;
                if !(1..=4096).contains(&off) {
                    return Err(ObjectError::Invalid("tp_dictoffset"));
                }
                let dict = self.ptr(obj.wrapping_add(off as u64))?;
                if dict == 0 {
                    return Ok(Vec::new());
                }
                self.dict_entries(dict)
            }
            AttrLayout::Managed => {
                let dict = self.ptr(obj.wrapping_sub(24))?;
                if dict != 0 {
                    return self.dict_entries(dict);
                }
                let values = self.ptr(obj.wrapping_sub(32))?;
                if values == 0 {
                    return Ok(Vec::new());
                }
                self.keys_entries(cached()?, values)
            }
            AttrLayout::Tagged => {
                let dorv = self.ptr(obj.wrapping_sub(24))?;
                match dorv {
                    0 => Ok(Vec::new()),
                    // `_PyDictOrValues_GetValues`: the values are at the tagged pointer + 1.
                    v if v & 1 == 1 => self.keys_entries(cached()?, v.wrapping_add(1)),
                    dict => self.dict_entries(dict),
                }
            }
            AttrLayout::Inline => {
                let dict = self.ptr(obj.wrapping_sub(24))?;
                if dict != 0 {
                    return self.dict_entries(dict);
                }
                if flags & TPFLAGS_INLINE_VALUES == 0 {
                    return Ok(Vec::new());
                }
                let size = self
                    .mem
                    .read_u64(ty.wrapping_add(self.obj.type_basicsize))?;
                if !(16..=4096).contains(&size) {
                    return Err(ObjectError::Invalid("tp_basicsize"));
                }
                let values = obj.wrapping_add(size);
                // PyDictValues.valid
                if self.mem.read_u8(values.wrapping_add(3))? == 0 {
                    return Ok(Vec::new());
                }
                self.keys_entries(cached()?, values)
            }
        }
    }

    /// `obj.name` for an instance attribute, with the name's key object.
    pub fn getattr(&self, obj: u64, name: &str) -> Result<Option<(u64, u64)>> {
        Ok(self.find_str_key(self.attrs(obj)?, name))
    }

    /// The items of a tuple.
    pub fn tuple(&self, obj: u64) -> Result<Vec<u64>> {
        let n = self.mem.read_u64(obj.wrapping_add(OB_SIZE))?;
        if n > MAX_TUPLE_ITEMS {
            return Err(ObjectError::Invalid("tuple size"));
        }
        let mut raw = vec![0u8; n as usize * 8];
        self.mem
            .read(obj.wrapping_add(self.obj.tuple_items), &mut raw)?;
        Ok(raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect())
    }

    /// The str object `name` among the names a function's code uses (`co_names`): the interned
    /// str that attribute dicts are keyed by.
    pub fn code_name(&self, func: u64, name: &str) -> Result<Option<u64>> {
        if self.type_name(func)? != "function" {
            return Err(ObjectError::Invalid("function"));
        }
        let code = self.ptr(func.wrapping_add(self.obj.func_code))?;
        let names = self.ptr(code.wrapping_add(self.obj.code_names))?;
        Ok(self
            .tuple(names)?
            .into_iter()
            .find(|&s| self.str(s).is_ok_and(|s| s == name)))
    }

    /// A type's own `__dict__` entry `name` (a method, a class attribute).
    pub fn type_attr(&self, ty: u64, name: &str) -> Result<Option<u64>> {
        let dict = self.ptr(ty.wrapping_add(self.obj.type_dict))?;
        Ok(self.dict_get(dict, name)?.map(|(_, v)| v))
    }

    /// A module's `__dict__`.
    pub fn module_dict(&self, module: u64) -> Result<u64> {
        if self.type_name(module)? != "module" {
            return Err(ObjectError::Invalid("module"));
        }
        self.ptr(module.wrapping_add(MODULE_DICT))
    }
}

/// A str found in the target: its address and hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Key {
    /// Address of the str object.
    pub addr: u64,
    /// Its cached hash.
    pub hash: u64,
}

/// What OpenTelemetry's current span is reached through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OtelObjects {
    /// The `current_context` ContextVar.
    pub var: u64,
    /// Its HAMT hash.
    pub var_hash: u32,
    /// The `current-span-<uuid>` key.
    pub span_key: Key,
    /// The interned `_context`.
    pub context_name: Key,
}

/// Whose local OSProfiler's `__local_ctx` is: a thread's (`threading.local`), or a green
/// thread's when eventlet or gevent monkey-patched `threading.local` before OSProfiler's import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalKind {
    /// CPython's `_thread._local`.
    Thread,
    /// eventlet's `corolocal.local`: `local` is its `_local__greens` WeakKeyDictionary's `data`
    /// (weakref(greenlet) → the greenlet's attributes).
    Eventlet,
    /// gevent's `local`: `local` is its `_localimpl`'s `dicts` (id(greenlet) → an entry of a
    /// weakref to the greenlet and its attributes).
    Gevent,
}

/// What OSProfiler's trace stack is reached through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OspObjects {
    /// Thread: ≤3.12 the local's key str, 3.13 its `localdicts` dict (hash unused); green: the
    /// dict of every greenlet's attributes (hash unused).
    pub local: Key,
    /// Whose local it is.
    pub kind: LocalKind,
    /// `&PyDict_Type` (the type of the module's globals).
    pub dict_type: u64,
    /// The interned `profiler`.
    pub profiler_name: Key,
    /// `osprofiler.profiler._Profiler`.
    pub profiler_type: u64,
    /// The interned `_trace_stack`.
    pub stack_name: Key,
}

/// What span and trace point names are read through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameObjects {
    /// The interned `_name`: the attribute of an OpenTelemetry SDK span (`ReadableSpan`) that
    /// holds its name, of OSProfiler's `_Profiler` that holds its deque of trace point names,
    /// and of a `threading.Thread` that holds its name. One object: every identifier a code
    /// object uses is interned in one table.
    pub attr: Key,
    /// `&PyUnicode_Type`, the type of `attr`: a name must be an exact str.
    pub str_type: u64,
}

/// Modules span reading needs.
const OTEL_CONTEXT: &str = "opentelemetry.context";
const OTEL_PROPAGATION: &str = "opentelemetry.trace.propagation";
const OTEL_SPAN: &str = "opentelemetry.trace.span";
const OSP_PROFILER: &str = "osprofiler.profiler";
/// The SDK, for span names only: spans of the API alone (NonRecordingSpan) have none, and the
/// SDK may be imported after the API.
const OTEL_SDK_TRACE: &str = "opentelemetry.sdk.trace";
/// For thread names: `threading._active` and the `_name` of `Thread.__init__`.
const THREADING: &str = "threading";
const WANTED: [&str; 6] = [
    OTEL_CONTEXT,
    OTEL_PROPAGATION,
    OTEL_SPAN,
    OSP_PROFILER,
    OTEL_SDK_TRACE,
    THREADING,
];

/// A library's modules are in `sys.modules` from the start of their import, its objects only
/// once it ran: after the modules appear, their objects are looked for at every look for this
/// many looks (5–10 s at spanprof's 50–100 ms tick), then every [`RETRY_EVERY`] looks (a library that
/// never binds them, or reads that keep racing with the process).
const EAGER_LOOKS: u32 = 100;
const RETRY_EVERY: u32 = 20;

/// How many looks after the one that read the `sys.modules` dict use it before it is read again.
const MODULES_READ_EVERY: u32 = 20;

/// Looks for the tracing libraries in one process, again and again as it imports modules.
#[derive(Debug, Default)]
pub struct SpanFinder {
    /// The keys object of `sys.modules` scanned last, and how many entries it had.
    scanned: (u64, u64),
    /// Module objects found, by [`WANTED`] index.
    modules: [u64; 6],
    /// Looks since a library's module was seen without its objects being found.
    unresolved_looks: u32,
    /// The `sys.modules` dict read last (0: none yet), and the looks since it was read: the
    /// interpreter keeps one for its life, so two reads of every look are saved, and it is
    /// read again after [`MODULES_READ_EVERY`] looks of it (finalization clears it).
    modules_dict: (u64, u32),
    /// Found so far.
    pub otel: Option<OtelObjects>,
    /// Found so far.
    pub osp: Option<OspObjects>,
    /// Found so far (from the SDK, OSProfiler or threading, whichever comes first).
    pub names: Option<NameObjects>,
    /// `threading._active`, found so far: the Thread objects by `get_ident()`, for thread names.
    pub threading_active: Option<u64>,
    /// `_Py_HashSecret`'s address (0: unknown), to hash a str that has not cached its hash.
    hash_secret: u64,
}

impl SpanFinder {
    /// A finder for a process whose `_Py_HashSecret` is at `hash_secret` (0: unknown).
    pub fn new(hash_secret: u64) -> Self {
        SpanFinder {
            hash_secret,
            ..SpanFinder::default()
        }
    }

    /// Looks at `sys.modules` again (only its new entries) and at the modules found; true when
    /// something new was found. `runtime` is `_PyRuntime`'s address.
    pub fn look<M: ProcessMemory>(&mut self, o: &Objects<'_, M>, runtime: u64) -> bool {
        if self.otel.is_some()
            && self.osp.is_some()
            && self.names.is_some()
            && self.threading_active.is_some()
        {
            return false;
        }
        let before = (self.otel, self.osp, self.names, self.threading_active);
        // New modules, or a module found whose objects were not (a look in the middle of its
        // import, or a read that raced with the process).
        let unresolved = (self.otel.is_none() && self.modules[..3].iter().any(|&m| m != 0))
            || (self.osp.is_none() && self.modules[3] != 0)
            || (self.names.is_none() && self.modules[3..].iter().any(|&m| m != 0))
            || (self.threading_active.is_none() && self.modules[5] != 0);
        let retry = unresolved
            && (self.unresolved_looks < EAGER_LOOKS
                || self.unresolved_looks.is_multiple_of(RETRY_EVERY));
        if unresolved {
            self.unresolved_looks = self.unresolved_looks.saturating_add(1);
        }
        if self.scan_modules(o, runtime).unwrap_or(false) || retry {
            if self.otel.is_none() {
                self.otel = self.find_otel(o).ok().flatten();
            }
            if self.osp.is_none() {
                self.osp = self.find_osp(o).ok().flatten();
            }
            if self.names.is_none() {
                self.names = self.find_names(o).ok().flatten();
            }
            if self.threading_active.is_none() {
                self.threading_active = self.find_threading_active(o).ok().flatten();
            }
        }
        before != (self.otel, self.osp, self.names, self.threading_active)
    }

    /// `threading._active`: a dict bound once at the module's import, never replaced.
    fn find_threading_active<M: ProcessMemory>(&self, o: &Objects<'_, M>) -> Result<Option<u64>> {
        let module = self.modules[5];
        if module == 0 {
            return Ok(None);
        }
        let Some((_, active)) = o.dict_get(o.module_dict(module)?, "_active")? else {
            return Ok(None);
        };
        if o.type_name(active)? != "dict" {
            return Err(ObjectError::Invalid("threading._active is not a dict"));
        }
        Ok(Some(active))
    }

    /// Reads the entries of `sys.modules` added since the last scan; true if there were any.
    fn scan_modules<M: ProcessMemory>(&mut self, o: &Objects<'_, M>, runtime: u64) -> Result<bool> {
        let (mut modules, looks) = self.modules_dict;
        if modules == 0 || looks >= MODULES_READ_EVERY {
            let interp = o.ptr(runtime.wrapping_add(o.py.runtime_interpreters_head))?;
            modules = o.ptr(interp.wrapping_add(o.obj.interp_modules))?;
            self.modules_dict = (modules, 0);
            if modules == 0 {
                return Ok(false);
            }
        } else {
            self.modules_dict.1 += 1;
        }
        let keys = o.ptr(modules.wrapping_add(o.obj.dict_keys))?;
        let nentries = o.mem.read_u64(keys.wrapping_add(match o.obj.dict_layout {
            DictLayout::Size => 32,
            DictLayout::Log2 => 24,
        }))?;
        if (keys, nentries) == self.scanned {
            return Ok(false);
        }
        // A new keys object (the dict grew) is read whole; otherwise only the entries added
        // since (entries are appended): the cost is reading their names.
        let skip = if keys == self.scanned.0 && nentries >= self.scanned.1 {
            self.scanned.1 as usize
        } else {
            0
        };
        let slots = o.keys_slots(keys, 0)?;
        for &(k, v) in slots.iter().skip(skip) {
            if k == 0 || v == 0 {
                continue;
            }
            let Ok(name) = o.str(k) else { continue };
            if let Some(i) = WANTED.iter().position(|w| *w == name) {
                self.modules[i] = v;
            }
        }
        self.scanned = (keys, nentries);
        Ok(true)
    }

    fn find_otel<M: ProcessMemory>(&self, o: &Objects<'_, M>) -> Result<Option<OtelObjects>> {
        let [ctx, prop, span, ..] = self.modules;
        if ctx == 0 || prop == 0 || span == 0 {
            return Ok(None);
        }
        let Some((_, runtime)) = o.dict_get(o.module_dict(ctx)?, "_RUNTIME_CONTEXT")? else {
            return Ok(None);
        };
        // The runtime context itself, or one that wraps it (a publisher such as
        // spanprof-context keeps the original in an attribute).
        let attrs = o.attrs(runtime)?;
        let var = match o.find_str_key(attrs.clone(), "_current_context") {
            Some((_, var)) => var,
            None => {
                let inner = attrs
                    .into_iter()
                    .take(16)
                    .find_map(|(_, v)| o.getattr(v, "_current_context").ok().flatten());
                let Some((_, var)) = inner else {
                    return Ok(None);
                };
                var
            }
        };
        if !o.type_name(var)?.ends_with("ContextVar") {
            return Err(ObjectError::Invalid("current_context is not a ContextVar"));
        }
        let var_hash = hamt_hash(o.mem.read_u64(var.wrapping_add(o.obj.contextvar_hash))?);
        let Some((key_name, key)) = o.dict_get(o.module_dict(prop)?, "_SPAN_KEY")? else {
            return Ok(None);
        };
        if !o.str(key)?.starts_with("current-span-") {
            return Err(ObjectError::Invalid("span key"));
        }
        // The key is hashed when the first span is set: computed until then, so that the first
        // span is read from its first sample.
        let key_hash = match o.str_hash(key) {
            Err(_) if self.hash_secret != 0 => {
                computed_str_hash(o, self.hash_secret, key, key_name)?
            }
            cached => cached?,
        };
        // The interned "_context": a key of INVALID_SPAN's attributes (a NonRecordingSpan).
        let Some((_, invalid)) = o.dict_get(o.module_dict(span)?, "INVALID_SPAN")? else {
            return Ok(None);
        };
        let Some((name, _)) = o.getattr(invalid, "_context")? else {
            return Ok(None);
        };
        Ok(Some(OtelObjects {
            var,
            var_hash,
            span_key: Key {
                addr: key,
                hash: key_hash,
            },
            context_name: Key {
                addr: name,
                hash: o.str_hash(name)?,
            },
        }))
    }

    /// The interned `_name`, from the code that sets it: the SDK's `ReadableSpan.__init__`
    /// (`self._name = name`), OSProfiler's `_Profiler.start` (`self._name.append(name)`) or
    /// threading's `Thread.__init__` (`self._name = …`).
    fn find_names<M: ProcessMemory>(&self, o: &Objects<'_, M>) -> Result<Option<NameObjects>> {
        let places = [
            (self.modules[4], "ReadableSpan", "__init__"),
            (self.modules[3], "_Profiler", "start"),
            (self.modules[5], "Thread", "__init__"),
        ];
        for (module, class, method) in places {
            if module == 0 {
                continue;
            }
            // One library not ready (mid-import) does not hide the other.
            let found = (|| -> Result<Option<u64>> {
                let Some((_, ty)) = o.dict_get(o.module_dict(module)?, class)? else {
                    return Ok(None);
                };
                let Some(func) = o.type_attr(ty, method)? else {
                    return Ok(None);
                };
                o.code_name(func, "_name")
            })();
            let Ok(Some(attr)) = found else { continue };
            if o.type_name(attr)? != "str" {
                return Err(ObjectError::Invalid("_name is not a str"));
            }
            return Ok(Some(NameObjects {
                attr: Key {
                    addr: attr,
                    hash: o.str_hash(attr)?,
                },
                str_type: o.ptr(attr.wrapping_add(OB_TYPE))?,
            }));
        }
        Ok(None)
    }

    fn find_osp<M: ProcessMemory>(&self, o: &Objects<'_, M>) -> Result<Option<OspObjects>> {
        let module = self.modules[3];
        if module == 0 {
            return Ok(None);
        }
        let globals = o.module_dict(module)?;
        let (Some((_, local)), Some((_, profiler_type)), Some((_, init))) = (
            o.dict_get(globals, "__local_ctx")?,
            o.dict_get(globals, "_Profiler")?,
            o.dict_get(globals, "init")?,
        ) else {
            return Ok(None);
        };
        let dict_type = o.ptr(globals.wrapping_add(OB_TYPE))?;
        if o.type_name(local)? != "_thread._local" {
            let Some((local, kind)) = green_local(o, local)? else {
                return Err(ObjectError::Invalid(
                    "__local_ctx is not a threading.local, nor eventlet's or gevent's local",
                ));
            };
            return self.osp_objects(o, local, kind, dict_type, profiler_type, init);
        }
        let local = match (o.obj.local_key, o.obj.local_dicts) {
            (Some(off), _) => {
                let key = o.ptr(local.wrapping_add(off))?;
                Key {
                    addr: key,
                    hash: o.str_hash(key)?,
                }
            }
            (None, Some(off)) => {
                let dicts = o.ptr(local.wrapping_add(off))?;
                if o.type_name(dicts)? != "dict" {
                    return Err(ObjectError::Invalid("localdicts"));
                }
                Key {
                    addr: dicts,
                    hash: 0,
                }
            }
            (None, None) => return Err(ObjectError::Invalid("threading.local layout")),
        };
        self.osp_objects(o, local, LocalKind::Thread, dict_type, profiler_type, init)
    }

    /// The rest of [`OspObjects`]: the interned names `init` and `_Profiler.__init__` use.
    fn osp_objects<M: ProcessMemory>(
        &self,
        o: &Objects<'_, M>,
        local: Key,
        kind: LocalKind,
        dict_type: u64,
        profiler_type: u64,
        init: u64,
    ) -> Result<Option<OspObjects>> {
        // `init`, or the function a wrapper of it (functools.wraps) says it wraps.
        let profiler_name = match o.code_name(init, "profiler")? {
            Some(name) => name,
            None => {
                let wrapped = o.getattr(init, "__wrapped__")?.map(|(_, f)| f);
                let Some(name) = wrapped.and_then(|f| o.code_name(f, "profiler").ok().flatten())
                else {
                    return Ok(None);
                };
                name
            }
        };
        let Some(ctor) = o.type_attr(profiler_type, "__init__")? else {
            return Ok(None);
        };
        let Some(stack_name) = o.code_name(ctor, "_trace_stack")? else {
            return Ok(None);
        };
        Ok(Some(OspObjects {
            local,
            kind,
            dict_type,
            profiler_name: Key {
                addr: profiler_name,
                hash: o.str_hash(profiler_name)?,
            },
            profiler_type,
            stack_name: Key {
                addr: stack_name,
                hash: o.str_hash(stack_name)?,
            },
        }))
    }
}

/// Fields of an object read when looking for what a green-thread local holds.
const MAX_FIELDS: u64 = 16;

/// The pointers in the fields of `obj` after its header (up to its type's `tp_basicsize`, at
/// most [`MAX_FIELDS`]): the slots of a Python class, the fields of a Cython one.
fn fields<M: ProcessMemory>(o: &Objects<'_, M>, obj: u64) -> Result<Vec<u64>> {
    let ty = o.ptr(obj.wrapping_add(OB_TYPE))?;
    let size = o.mem.read_u64(ty.wrapping_add(o.obj.type_basicsize))?;
    if !(16..=4096).contains(&size) {
        return Err(ObjectError::Invalid("tp_basicsize"));
    }
    let n = ((size - 16) / 8).min(MAX_FIELDS);
    (0..n)
        .map(|i| o.ptr(obj.wrapping_add(16 + 8 * i)))
        .filter(|p| !matches!(p, Ok(0)))
        .collect()
}

/// OSProfiler's local when it is eventlet's or gevent's (both replace `threading.local` when
/// they monkey-patch): the dict of every greenlet's attributes, told by the types of what the
/// local's fields hold (by name: the layouts differ between gevent's compiled and pure-Python
/// builds, and the slots of a Python class are in sorted order). `None`: neither.
fn green_local<M: ProcessMemory>(
    o: &Objects<'_, M>,
    local: u64,
) -> Result<Option<(Key, LocalKind)>> {
    let key = |addr| Key { addr, hash: 0 };
    for field in fields(o, local)? {
        let Ok(name) = o.type_name(field) else {
            continue;
        };
        if name == "WeakKeyDictionary" {
            // eventlet.corolocal: `_local__greens`, whose `data` maps weakref(greenlet) → dict.
            let Some((_, data)) = o.getattr(field, "data")? else {
                return Err(ObjectError::Invalid("WeakKeyDictionary without data"));
            };
            if o.type_name(data)? != "dict" {
                return Err(ObjectError::Invalid("WeakKeyDictionary.data is not a dict"));
            }
            return Ok(Some((key(data), LocalKind::Eventlet)));
        }
        if name.ends_with("_localimpl") {
            // gevent: `_local__impl`, whose `dicts` (a `_wrefdict`) maps id(greenlet) → entry.
            for inner in fields(o, field)? {
                if o.type_name(inner).is_ok_and(|n| n.ends_with("_wrefdict")) {
                    return Ok(Some((key(inner), LocalKind::Gevent)));
                }
            }
            return Err(ObjectError::Invalid(
                "gevent's _localimpl without its dicts",
            ));
        }
    }
    Ok(None)
}

mod hashes;
pub use hashes::{computed_str_hash, hamt_hash, py_hash_bytes};

#[cfg(test)]
mod tests;
