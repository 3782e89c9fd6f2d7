//! Python thread names: `threading._active` read from another process's memory, for the
//! `thread.name` of Python threads.

use super::memory::ProcessMemory;
use super::objects::{ObjectError, Objects, Result, OB_SIZE};

/// Threads whose names one [`Objects::thread_names`] reads at most.
pub const MAX_THREAD_NAMES: usize = 4096;
/// Attributes of a `threading.Thread` (about 20): an object with more is not read as one.
const MAX_THREAD_ATTRS: usize = 256;
/// `offsetof(PyLongObject, ob_digit)` (`long_value.ob_digit` from 3.12), 3.8–3.15.
const LONG_DIGITS: u64 = 24;

impl<M: ProcessMemory> Objects<'_, M> {
    /// A small non-negative `int` (at most three 30-bit digits), such as a thread id.
    pub fn small_int(&self, obj: u64) -> Result<u64> {
        let size = self.mem.read_u64(obj.wrapping_add(OB_SIZE))?;
        let (digits, negative) = if self.obj.long_tag {
            // lv_tag: digits << 3 | sign (0 positive, 1 zero, 2 negative).
            (size >> 3, size & 3 == 2)
        } else {
            // ob_size: the number of digits, negative for a negative int.
            (size, (size as i64) < 0)
        };
        if negative || digits > 3 {
            return Err(ObjectError::Invalid("int out of range"));
        }
        let mut raw = [0u8; 12];
        self.mem.read(
            obj.wrapping_add(LONG_DIGITS),
            &mut raw[..digits as usize * 4],
        )?;
        let mut value = 0u64;
        for i in (0..digits as usize).rev() {
            let d = u32::from_le_bytes(raw[i * 4..i * 4 + 4].try_into().unwrap());
            if d >> 30 != 0 {
                return Err(ObjectError::Invalid("int digit"));
            }
            value = value << 30 | u64::from(d);
        }
        Ok(value)
    }

    /// The names of the process's `threading.Thread`s by native thread id (`threading._active`:
    /// each started thread's `_native_id` and `_name`); empty before `threading` is imported.
    /// At most [`MAX_THREAD_NAMES`] threads are read (a process with more keeps the OS names of
    /// the others).
    pub fn thread_names(&self, runtime: u64) -> Result<Vec<(u64, String)>> {
        let interp = self.ptr(runtime.wrapping_add(self.py.runtime_interpreters_head))?;
        let modules = self.ptr(interp.wrapping_add(self.obj.interp_modules))?;
        if modules == 0 {
            return Ok(Vec::new());
        }
        let Some((_, threading)) = self.dict_get(modules, "threading")? else {
            return Ok(Vec::new());
        };
        let globals = self.module_dict(threading)?;
        let Some((_, active)) = self.dict_get(globals, "_active")? else {
            return Ok(Vec::new());
        };
        let mut names = Vec::new();
        for (_, thread) in self
            .dict_entries(active)?
            .into_iter()
            .take(MAX_THREAD_NAMES)
        {
            if thread == 0 {
                continue;
            }
            // One read of the instance's attributes serves both.
            let Ok(attrs) = self.attrs(thread) else {
                continue;
            };
            if attrs.len() > MAX_THREAD_ATTRS {
                continue;
            }
            let (Some((_, id)), Some((_, name))) = (
                self.find_str_key(attrs.clone(), "_native_id"),
                self.find_str_key(attrs, "_name"),
            ) else {
                continue;
            };
            // A thread not yet started, or a name that is not a str: skipped.
            let (Ok(id), Ok(name)) = (self.small_int(id), self.str(name)) else {
                continue;
            };
            names.push((id, name));
        }
        Ok(names)
    }
}
