//! What every Python test here uses: the interpreters under test, the prerequisites, and the
//! failure messages.

use std::path::PathBuf;

use spanprof_tests::{
    folded_summary, pyenv_python, require_root, spanprof_bin, system_python, FoldedStack, RunOutput,
};

/// A CPython interpreter under test.
pub(super) struct Interp {
    pub(super) path: PathBuf,
    pub(super) minor: u8,
    pub(super) label: String,
}

impl Interp {
    #[track_caller]
    pub(super) fn pyenv(minor: u8) -> Self {
        let path = pyenv_python(minor);
        let label = format!("pyenv {}", path.display());
        Self { path, minor, label }
    }

    #[track_caller]
    pub(super) fn debian_3_11() -> Self {
        let path = system_python("/usr/bin/python3.11", "python3.11");
        Self {
            path,
            minor: 11,
            label: "Debian /usr/bin/python3.11".into(),
        }
    }

    /// The name spanprof (and py-spy) give a method: `co_qualname` from 3.11,
    /// `co_name` before.
    pub(super) fn method(&self, class: &str, name: &str) -> String {
        if self.minor >= 11 {
            format!("{class}.{name}")
        } else {
            name.to_owned()
        }
    }

    /// The path as a string, for `sh -c` command lines.
    pub(super) fn path_str(&self) -> &str {
        self.path.to_str().expect("interpreter paths are UTF-8")
    }
}

/// Everything a test here needs before it takes the lock.
#[track_caller]
pub(super) fn require_python_profiling() {
    require_root();
    spanprof_bin();
}

/// Folded stacks printed for failure messages.
pub(super) fn top(stacks: &[FoldedStack]) -> String {
    folded_summary(stacks, 12)
}

/// Fails with every problem found, the interpreter and the heaviest stacks.
#[track_caller]
pub(super) fn assert_no_problems(
    problems: &[String],
    interp: &Interp,
    stacks: &[FoldedStack],
    out: &RunOutput,
) {
    assert!(
        problems.is_empty(),
        "{}:\n- {}\nheaviest stacks:\n{}\n{out}",
        interp.label,
        problems.join("\n- "),
        top(stacks)
    );
}
