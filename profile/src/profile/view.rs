//! Which frames a profile's stacks show (`--view`): Python's own, or every frame.
//!
//! A sample of a Python thread holds its Python frames and the native frames of the code that
//! ran them. Some of those native frames are the interpreter itself ([`Frame::interpreter`]):
//! its loop, object allocator, integer, dict and string code, the garbage collector, argument
//! parsing, the call glue between two Python functions. A Python user reads them as the cost of
//! the Python line that ran them, as py-spy and the OpenTelemetry eBPF profiler show it. The
//! Python view leaves them out of every sample that has a Python frame, so their time is the
//! self time of the frame that called them: the Python function, or the C extension function
//! (`zlib.compress`, a `_json` encoder) that called back into the interpreter. So do the
//! [`RUNTIME_HELPERS`] the interpreter (or a Python frame) calls. Between two Python frames,
//! the interpreter's C code that called the inner one back (`sorted(key=f)`: `builtin_sorted`,
//! `list_sort_impl`) stays, but not the [`CALL_GLUE`] of a plain Python call. Native code
//! outside the interpreter (extension modules, libc, libz, libssl) and kernel frames stay.
//! Samples without a Python frame (native threads, native processes, an interpreter starting
//! up) keep every frame.

use std::borrow::Cow;
use std::collections::HashMap;

use super::{FrameKind, Profile, Sample};

/// Functions outside the interpreter's file that run for the interpreter's own sake when it
/// calls them (or its loop, shown as a Python frame, does): the dynamic loader's look-up of
/// a thread-local variable (the thread state of CPython 3.12+, in a `libpython3.X.so`). The
/// Python view leaves them out with the interpreter's frames.
pub const RUNTIME_HELPERS: &[&str] = &["__tls_get_addr"];

/// The interpreter's functions that carry a call from one function to the next (the loop's
/// own entry points, vectorcall, `PyObject_Call`…), by the start of their names: between two
/// Python frames they are a Python-to-Python call (every call of 3.8–3.10 goes through them),
/// not C code that called Python back. So are a class's special methods called through its
/// type's slots (`type_call`, `slot_tp_init`: `C()` running `C.__init__`) and a generator
/// resumed from C (`gen_iternext`, `gen_send_ex`: a `for` loop over it before 3.12).
pub const CALL_GLUE: &[&str] = &[
    "_PyEval_",
    "PyEval_",
    "_PyFunction_",
    "function_code_fastcall",
    "function_call",
    "call_function",
    "do_call_core",
    "fast_function",
    "_PyObject_Vectorcall",
    "PyObject_Vectorcall",
    "_PyObject_FastCall",
    "_PyObject_Call",
    "PyObject_Call",
    "_PyObject_MakeTpCall",
    "object_vacall",
    "PyVectorcall_",
    "_PyVectorcall_",
    "method_vectorcall",
    "cfunction_",
    "_PyCFunction_",
    "PyCFunction_",
    "vectorcall_",
    "slot_",
    "type_call",
    "call_unbound",
    "gen_iternext",
    "gen_send",
    "_PyGen_",
    "PyIter_Send",
];

/// Whether an interpreter frame between two Python frames is C code that called the inner one
/// back, shown in the Python view: a named function that is not [`CALL_GLUE`] (an unnamed
/// address of a stripped interpreter cannot be told from glue, and goes).
fn is_c_caller(f: &super::Frame) -> bool {
    f.function
        .as_deref()
        .is_some_and(|n| !CALL_GLUE.iter().any(|g| n.starts_with(g)))
}

/// Which frames a profile's stacks show (`--view`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum View {
    /// In a sample with Python frames, the interpreter's own native frames are left out: their
    /// time is the self time of the frame that called them.
    #[default]
    Python,
    /// Every frame, as recorded: the interpreter's frames among the Python frames.
    Full,
}

impl View {
    /// Every view, in the order help texts list them.
    pub const ALL: [View; 2] = [View::Python, View::Full];

    /// Parses a `--view` value: `python` or `full` (ASCII case ignored).
    pub fn from_name(name: &str) -> Option<View> {
        View::ALL
            .into_iter()
            .find(|v| v.name().eq_ignore_ascii_case(name))
    }

    /// The value's name, the inverse of [`View::from_name`].
    pub fn name(self) -> &'static str {
        match self {
            View::Python => "python",
            View::Full => "full",
        }
    }
}

impl Profile {
    /// The profile as `view` shows it: itself when nothing changes (the full view, or no
    /// interpreter frame in it), else a copy whose samples with Python frames lost their
    /// interpreter frames ([`Frame::interpreter`](super::Frame::interpreter)), samples that
    /// became alike merged (the first one's place kept). The frame table stays whole: sinks
    /// write only the frames samples use.
    pub fn in_view(&self, view: View) -> Cow<'_, Profile> {
        if view == View::Full || !self.frames.iter().any(|f| f.interpreter) {
            return Cow::Borrowed(self);
        }
        let frame = |id: u32| self.frames.get(id as usize);
        let mut out = Profile {
            samples: Vec::with_capacity(self.samples.len()),
            ..self.clone_without_samples()
        };
        // The place of each distinct sample key in `out.samples`.
        let mut seen: HashMap<SampleKey, usize> = HashMap::with_capacity(self.samples.len());
        for sample in &self.samples {
            let mut sample = sample.clone();
            let is_python = |id: &u32| frame(*id).is_some_and(|f| f.kind == FrameKind::Python);
            if let (Some(first), Some(last)) = (
                sample.frames.iter().position(is_python),
                sample.frames.iter().rposition(is_python),
            ) {
                // Root first: a frame's caller is the frame kept or dropped before it.
                let mut caller_is_python = false;
                let mut i = 0;
                sample.frames.retain(|&id| {
                    let at = i;
                    i += 1;
                    let Some(f) = frame(id) else {
                        return true;
                    };
                    let helper = caller_is_python
                        && f.function
                            .as_deref()
                            .is_some_and(|n| RUNTIME_HELPERS.contains(&n));
                    caller_is_python = f.kind == FrameKind::Python || f.interpreter || helper;
                    if helper {
                        return false;
                    }
                    // Between two Python frames, the interpreter's C code that called the
                    // inner one back (`builtin_sorted`, `map_next`) stays; its call glue goes.
                    !f.interpreter || (first < at && at < last && is_c_caller(f))
                });
            }
            match seen.entry(SampleKey::of(&sample)) {
                std::collections::hash_map::Entry::Occupied(at) => {
                    out.samples[*at.get()].absorb(&mut sample);
                }
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(out.samples.len());
                    out.samples.push(sample);
                }
            }
        }
        Cow::Owned(out)
    }

    /// The profile as `view` shows it ([`Profile::in_view`]), taken by value.
    pub fn into_view(self, view: View) -> Profile {
        match self.in_view(view) {
            Cow::Owned(viewed) => viewed,
            Cow::Borrowed(_) => self,
        }
    }

    /// The modules of the interpreter frames samples use ([`Frame::interpreter`](super::Frame::interpreter)),
    /// sorted, each once: what pprof and OTLP files mark.
    pub fn interpreter_modules(&self) -> Vec<&str> {
        let mut used = vec![false; self.frames.len()];
        for s in &self.samples {
            for &id in &s.frames {
                if let Some(u) = used.get_mut(id as usize) {
                    *u = true;
                }
            }
        }
        let mut modules: Vec<&str> = self
            .frames
            .iter()
            .zip(used)
            .filter(|(f, used)| *used && f.interpreter)
            .filter_map(|(f, _)| f.module.as_deref())
            .collect();
        modules.sort_unstable();
        modules.dedup();
        modules
    }

    /// A copy of everything but the samples.
    fn clone_without_samples(&self) -> Profile {
        Profile {
            meta: self.meta.clone(),
            frames: self.frames.clone(),
            threads: self.threads.clone(),
            processes: self.processes.clone(),
            samples: Vec::new(),
            spans: self.spans.clone(),
        }
    }
}

/// What tells two samples apart ([`Sample::absorb`] merges those with the same).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SampleKey {
    thread: u32,
    frames: Vec<u32>,
    span: Option<u32>,
    unwind: symbolizer::unwind::UnwindStatus,
    off_cpu: Option<super::OffCpuReason>,
}

impl SampleKey {
    fn of(s: &Sample) -> SampleKey {
        SampleKey {
            thread: s.thread,
            frames: s.frames.clone(),
            span: s.span,
            unwind: s.unwind,
            off_cpu: s.off_cpu,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fixture;
    use crate::profile::Frame;

    fn frame(kind: FrameKind, name: &str, module: &str, interpreter: bool) -> Frame {
        Frame {
            kind,
            function: Some(name.to_string()),
            module: (!module.is_empty()).then(|| module.to_string()),
            address: name.len() as u64,
            file: None,
            line: None,
            unknown_reason: None,
            ids: None,
            start_line: None,
            interpreter,
        }
    }

    /// Samples of a Python process: the interpreter's frames go from those with Python frames
    /// (its call glue between two Python frames too), its C code calling Python back stays,
    /// native code outside it stays, and samples without Python frames are whole.
    #[test]
    fn the_python_view_leaves_the_interpreter_out_of_python_stacks() {
        use FrameKind::{Native, Python};
        const LIB: &str = "/usr/lib/libpython3.11.so.1.0";
        let mut p = fixture::profile();
        p.frames = vec![
            frame(Native, "main", "/usr/bin/python3.11", false), // 0
            frame(Native, "Py_RunMain", LIB, true),              // 1
            frame(Python, "<module>", "", false),                // 2
            frame(Native, "_PyFunction_Vectorcall", LIB, true),  // 3
            frame(Python, "f", "", false),                       // 4
            frame(Native, "long_mul", LIB, true),                // 5
            frame(Native, "builtin_sorted", LIB, true),          // 6
            frame(Python, "key", "", false),                     // 7
            frame(Native, "zlib_compress", "/x/zlib.so", false), // 8
            frame(Native, "PyBytes_FromSize", LIB, true),        // 9
            frame(Native, "__tls_get_addr", "/lib/ld.so", false), // 10
        ];
        let stacks: [&[u32]; 5] = [
            &[0, 1, 2, 3, 4, 5],
            &[0, 1, 2, 3, 4, 6, 3, 7],
            &[0, 1, 2, 4, 8, 9],
            &[0, 2, 4, 10],
            &[0, 1, 5],
        ];
        let template = p.samples[0].clone();
        p.samples = stacks
            .iter()
            .map(|s| Sample {
                frames: s.to_vec(),
                count: 1,
                ..template.clone()
            })
            .collect();
        assert!(matches!(p.in_view(View::Full), Cow::Borrowed(_)));
        let viewed = p.in_view(View::Python);
        let got: Vec<(Vec<u32>, u64)> = viewed
            .samples
            .iter()
            .map(|s| (s.frames.clone(), s.count))
            .collect();
        assert_eq!(
            got,
            vec![
                // long_mul and __tls_get_addr are f's own time: one sample of 2.
                (vec![0, 2, 4], 2),
                (vec![0, 2, 4, 6, 7], 1),
                (vec![0, 2, 4, 8], 1),
                (vec![0, 1, 5], 1),
            ]
        );
        assert_eq!(p.interpreter_modules(), vec![LIB]);
    }
}
