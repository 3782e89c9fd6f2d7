//! A child process for the tests that need another live process.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// `sleep 30`, returned once it sleeps in its own program: exec done, the program and its
/// libraries mapped. (`/proc/PID/exe` names `sleep` before the kernel maps it.)
#[expect(
    clippy::zombie_processes,
    reason = "the child is returned: its caller kills and waits for it"
)]
pub(crate) fn sleeping() -> Child {
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command's closing parenthesis.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if exe.is_ok_and(|e| e.ends_with("sleep")) && state == Some('S') {
            return child;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sleep {pid} never slept: {stat}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
