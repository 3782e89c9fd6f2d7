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
//! [`RUNTIME_HELPERS`] the interpreter (or a Python frame) calls. Native code outside the
//! interpreter (extension modules, libc, libz, libssl) and kernel frames stay.
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
        let is = |id: u32, test: &dyn Fn(&super::Frame) -> bool| {
            self.frames.get(id as usize).is_some_and(test)
        };
        let mut out = Profile {
            samples: Vec::with_capacity(self.samples.len()),
            ..self.clone_without_samples()
        };
        // The place of each distinct sample key in `out.samples`.
        let mut seen: HashMap<SampleKey, usize> = HashMap::with_capacity(self.samples.len());
        for sample in &self.samples {
            let mut sample = sample.clone();
            let has_python = sample
                .frames
                .iter()
                .any(|&id| is(id, &|f| f.kind == FrameKind::Python));
            if has_python {
                // Root first: a frame's caller is the frame kept or dropped before it.
                let mut caller_is_python = false;
                sample.frames.retain(|&id| {
                    let Some(f) = self.frames.get(id as usize) else {
                        return true;
                    };
                    let helper = caller_is_python
                        && f.function
                            .as_deref()
                            .is_some_and(|n| RUNTIME_HELPERS.contains(&n));
                    caller_is_python = f.kind == FrameKind::Python || f.interpreter || helper;
                    !(f.interpreter || helper)
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
