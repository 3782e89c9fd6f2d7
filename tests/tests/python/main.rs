//! Python stacks unwound in the kernel, against real interpreters (pyenv's
//! CPython 3.8–3.13 and Debian's own `python3.11`), with py-spy run on the
//! same process at the same time as the reference:
//! - a known 50/30/20 split of CPU time between three functions is measured
//!   within ±5 points of the truth and of py-spy, with the same hottest lines;
//! - four threads each spinning in their own function each carry their own
//!   stack, also when they start after spanprof attached;
//! - a 300-deep recursion is whole or marked `[truncated]`, a 600-deep one is
//!   marked; generators and coroutines sit under their callers; a callback
//!   from C code (`sorted(key=…)`) has a non-Python frame between its caller
//!   and itself (3.11+); kernel frames come below native frames below Python
//!   frames;
//! - a Python process started after the session began is unwound;
//! - `--python-only` and `--no-lines` reshape the frames;
//! - a closure's frames are on its own lines, also in its prologue (which 3.11+ give no line).
//!
//! The tests are declared here, one per interpreter; their checks live in a module per part
//! (`split`, `threads`, `shapes`, `later`, `reshaped`, `churn`, `lines`), what they share in `common`.

use churn::{
    closures_lambdas_genexprs_are_named, freed_code_and_exiting_processes_never_mislead,
    freed_nested_code_never_misleads,
};
use common::Interp;
use later::{
    child_started_later_is_unwound, exec_after_start_is_unwound,
    python_frames_from_the_first_ms_in_command_mode,
};
use lines::closure_frames_are_on_their_own_lines;
use reshaped::python_only_without_lines;
use shapes::{
    c_calling_back_into_python_keeps_its_callers, deep_recursion_whole_or_truncated,
    generators_coroutines_callbacks_and_syscalls,
};
use split::split_matches_truth_and_py_spy;
use threads::{
    a_renamed_thread_keeps_each_name_on_its_samples, thread_per_request_threads_carry_their_names,
    threads_carry_their_own_stacks, threads_started_later_carry_their_own_stacks,
};
use view::{python_view_of_a_pyenv_interpreter, python_view_of_sid_3_14_in_a_container};

mod churn;
mod common;
mod later;
mod lines;
mod reshaped;
mod shapes;
mod split;
mod threads;
mod view;

/// Runs the checks of one test for each interpreter version, one test per version.
macro_rules! per_version {
    ($check:ident: $($name:ident => $minor:literal),+ $(,)?) => {
        $(
            #[test]
            fn $name() {
                $check(&Interp::pyenv($minor));
            }
        )+
    };
}

// ---------------------------------------------------------------------------
// 1. A known split, against the truth and py-spy
// ---------------------------------------------------------------------------

per_version!(split_matches_truth_and_py_spy:
    split_matches_truth_and_py_spy_3_8 => 8,
    split_matches_truth_and_py_spy_3_9 => 9,
    split_matches_truth_and_py_spy_3_10 => 10,
    split_matches_truth_and_py_spy_3_11 => 11,
    split_matches_truth_and_py_spy_3_12 => 12,
    split_matches_truth_and_py_spy_3_13 => 13,
);

/// Debian's own python3.11: stripped, no frame pointers, statically linked
/// interpreter (no libpython).
#[test]
fn split_matches_truth_and_py_spy_debian_3_11() {
    split_matches_truth_and_py_spy(&Interp::debian_3_11());
}

// ---------------------------------------------------------------------------
// 2. Threads
// ---------------------------------------------------------------------------

per_version!(threads_carry_their_own_stacks:
    threads_carry_their_own_stacks_3_8 => 8,
    threads_carry_their_own_stacks_3_9 => 9,
    threads_carry_their_own_stacks_3_10 => 10,
    threads_carry_their_own_stacks_3_11 => 11,
    threads_carry_their_own_stacks_3_12 => 12,
    threads_carry_their_own_stacks_3_13 => 13,
);

per_version!(threads_started_later_carry_their_own_stacks:
    threads_started_later_carry_their_own_stacks_3_8 => 8,
    threads_started_later_carry_their_own_stacks_3_11 => 11,
    threads_started_later_carry_their_own_stacks_3_12 => 12,
    threads_started_later_carry_their_own_stacks_3_13 => 13,
);

// ---------------------------------------------------------------------------
// 3. Deep stacks, generators, coroutines, callbacks from C
// ---------------------------------------------------------------------------

per_version!(deep_recursion_whole_or_truncated:
    deep_recursion_whole_or_truncated_3_8 => 8,
    deep_recursion_whole_or_truncated_3_9 => 9,
    deep_recursion_whole_or_truncated_3_10 => 10,
    deep_recursion_whole_or_truncated_3_11 => 11,
    deep_recursion_whole_or_truncated_3_12 => 12,
    deep_recursion_whole_or_truncated_3_13 => 13,
);

per_version!(generators_coroutines_callbacks_and_syscalls:
    generators_coroutines_callbacks_and_syscalls_3_8 => 8,
    generators_coroutines_callbacks_and_syscalls_3_9 => 9,
    generators_coroutines_callbacks_and_syscalls_3_10 => 10,
    generators_coroutines_callbacks_and_syscalls_3_11 => 11,
    generators_coroutines_callbacks_and_syscalls_3_12 => 12,
    generators_coroutines_callbacks_and_syscalls_3_13 => 13,
);

per_version!(c_calling_back_into_python_keeps_its_callers:
    c_calling_back_into_python_keeps_its_callers_3_8 => 8,
    c_calling_back_into_python_keeps_its_callers_3_9 => 9,
    c_calling_back_into_python_keeps_its_callers_3_10 => 10,
    c_calling_back_into_python_keeps_its_callers_3_11 => 11,
    c_calling_back_into_python_keeps_its_callers_3_12 => 12,
    c_calling_back_into_python_keeps_its_callers_3_13 => 13,
);

// ---------------------------------------------------------------------------
// 4. Python processes that start after the session
// ---------------------------------------------------------------------------

per_version!(exec_after_start_is_unwound:
    exec_after_start_is_unwound_3_11 => 11,
    exec_after_start_is_unwound_3_12 => 12,
    exec_after_start_is_unwound_3_8 => 8,
);

per_version!(python_frames_from_the_first_ms_in_command_mode:
    python_frames_from_the_first_ms_in_command_mode_3_8 => 8,
    python_frames_from_the_first_ms_in_command_mode_3_9 => 9,
    python_frames_from_the_first_ms_in_command_mode_3_10 => 10,
    python_frames_from_the_first_ms_in_command_mode_3_11 => 11,
    python_frames_from_the_first_ms_in_command_mode_3_12 => 12,
    python_frames_from_the_first_ms_in_command_mode_3_13 => 13,
);

#[test]
fn python_frames_from_the_first_ms_in_command_mode_debian_3_11() {
    python_frames_from_the_first_ms_in_command_mode(&Interp::debian_3_11());
}

per_version!(child_started_later_is_unwound:
    child_started_later_is_unwound_3_11 => 11,
    child_started_later_is_unwound_3_12 => 12,
    child_started_later_is_unwound_3_13 => 13,
);

#[test]
fn child_started_later_is_unwound_debian_3_11() {
    child_started_later_is_unwound(&Interp::debian_3_11());
}

// ---------------------------------------------------------------------------
// --python-only and --no-lines
// ---------------------------------------------------------------------------

per_version!(python_only_without_lines:
    python_only_without_lines_3_9 => 9,
    python_only_without_lines_3_12 => 12,
);

// ---------------------------------------------------------------------------
// 5. Code objects shared by many function objects, code objects freed while
//    the session runs, processes that exit while it runs
// ---------------------------------------------------------------------------

per_version!(closures_lambdas_genexprs_are_named:
    closures_lambdas_genexprs_are_named_3_8 => 8,
    closures_lambdas_genexprs_are_named_3_11 => 11,
    closures_lambdas_genexprs_are_named_3_12 => 12,
    closures_lambdas_genexprs_are_named_3_13 => 13,
);

per_version!(freed_code_and_exiting_processes_never_mislead:
    freed_code_and_exiting_processes_never_mislead_3_9 => 9,
    freed_code_and_exiting_processes_never_mislead_3_11 => 11,
    freed_code_and_exiting_processes_never_mislead_3_12 => 12,
    freed_code_and_exiting_processes_never_mislead_3_13 => 13,
);

per_version!(freed_nested_code_never_misleads:
    freed_nested_code_never_misleads_3_11 => 11,
    freed_nested_code_never_misleads_3_12 => 12,
    freed_nested_code_never_misleads_3_13 => 13,
);

// ---------------------------------------------------------------------------
// 6. Lines of frames before their first line
// ---------------------------------------------------------------------------

per_version!(closure_frames_are_on_their_own_lines:
    closure_frames_are_on_their_own_lines_3_8 => 8,
    closure_frames_are_on_their_own_lines_3_10 => 10,
    closure_frames_are_on_their_own_lines_3_11 => 11,
    closure_frames_are_on_their_own_lines_3_12 => 12,
    closure_frames_are_on_their_own_lines_3_13 => 13,
);

// ---------------------------------------------------------------------------
// 8. The Python view: the user's code first, native libraries under it
// ---------------------------------------------------------------------------

per_version!(python_view_of_a_pyenv_interpreter:
    python_view_puts_python_first_3_8 => 8,
    python_view_puts_python_first_3_9 => 9,
    python_view_puts_python_first_3_10 => 10,
    python_view_puts_python_first_3_11 => 11,
    python_view_puts_python_first_3_12 => 12,
    python_view_puts_python_first_3_13 => 13,
);

#[test]
fn python_view_puts_python_first_sid_3_14_in_a_container() {
    python_view_of_sid_3_14_in_a_container();
}

// ---------------------------------------------------------------------------
// 9. Short-lived threads named: a thread-per-request server
// ---------------------------------------------------------------------------

per_version!(thread_per_request_threads_carry_their_names:
    thread_per_request_threads_carry_their_names_3_8 => 8,
    thread_per_request_threads_carry_their_names_3_11 => 11,
    thread_per_request_threads_carry_their_names_3_13 => 13,
);

per_version!(a_renamed_thread_keeps_each_name_on_its_samples:
    a_renamed_thread_keeps_each_name_on_its_samples_3_8 => 8,
    a_renamed_thread_keeps_each_name_on_its_samples_3_11 => 11,
    a_renamed_thread_keeps_each_name_on_its_samples_3_13 => 13,
);
