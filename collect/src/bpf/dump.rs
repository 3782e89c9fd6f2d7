//! `spanprof dump`'s task iterator (`profiler-ebpf/src/dump.task.c`): one pass over the
//! system's tasks sends an off-CPU record for every thread of a target that is off its CPU; in
//! an off-CPU session, one for every blocked thread's interval so far.

use std::io::Read;

use aya::programs::Iter;
use aya::Btf;

use super::{aya_err, LoadError, Programs, DEFAULT_BTF_PATH};

impl Programs {
    /// Sends a record of every thread of the targets that is blocked (not on a CPU, not
    /// runnable) to the sample ring buffer: its kernel stack, user stack copy, Python frames
    /// and span context, as an off-CPU sample of weight 1 ns. The iterator program is loaded
    /// at the first call (kernel 6.8+: a sleepable task iterator whose global functions take a
    /// trusted task). Returns once the pass is over.
    pub fn dump_blocked_threads(&mut self) -> Result<(), LoadError> {
        self.run_task_iterator()
    }

    /// In an off-CPU session: sends, for every thread of the targets blocked now, a sampled
    /// off-CPU record of its interval so far (from its switch out, or from the session's start
    /// for a thread blocked before it), with its stacks as [`Programs::dump_blocked_threads`]
    /// reads them; the interval goes on from now. A session's end counts a thread blocked for
    /// its whole length this way, which no switch back in would have.
    pub fn count_open_intervals(&mut self) -> Result<(), LoadError> {
        self.run_task_iterator()
    }

    /// Loads the task iterator now, so that a later pass starts at once (its load, ~40 ms of
    /// BTF parsing and verification, would otherwise be in the middle of the session's end).
    pub fn load_task_iterator(&mut self) -> Result<(), LoadError> {
        self.task_iterator().map(|_| ())
    }

    fn task_iterator(&mut self) -> Result<&mut Iter, LoadError> {
        let program: &mut Iter = self
            .ebpf
            .program_mut("dump_threads")
            .expect("dump_threads is in the object")
            .try_into()
            .map_err(aya_err("find the task iterator"))?;
        if program.fd().is_err() {
            let btf = if self.btf_path == std::path::Path::new(DEFAULT_BTF_PATH) {
                Btf::from_sys_fs()
            } else {
                Btf::parse_file(&self.btf_path, aya::Endianness::default())
            }
            .map_err(|source| LoadError::BadBtf {
                path: self.btf_path.clone(),
                source,
            })?;
            program
                .load("task", &btf)
                .map_err(aya_err("load the task iterator (kernel 6.8 or later)"))?;
        }
        Ok(program)
    }

    fn run_task_iterator(&mut self) -> Result<(), LoadError> {
        let program = self.task_iterator()?;
        let link = program
            .attach()
            .map_err(aya_err("attach the task iterator"))?;
        let link = program
            .take_link(link)
            .map_err(aya_err("take the task iterator's link"))?;
        let mut file = link
            .into_file()
            .map_err(aya_err("open the task iterator"))?;
        // Each read runs the program over the next tasks; it writes nothing to the file, so
        // the pass is over at the first empty read.
        let mut sink = Vec::new();
        file.read_to_end(&mut sink)
            .map_err(aya_err("run the task iterator"))?;
        Ok(())
    }
}
