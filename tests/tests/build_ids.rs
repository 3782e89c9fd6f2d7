//! Build ids end to end: a program whose hot code is in a stripped shared library with hidden
//! symbols (`hidden_main` and `libspanprof_hidden.so`, see `tests/workloads/hidden_lib.c`).
//! spanprof cannot name those functions on this host; its pprof and OTLP files must carry the
//! library's build id and leave the frames as addresses, so that a tool holding the unstripped
//! copy names them: Google's pprof with the copy in `PPROF_BINARY_PATH`, found by build id,
//! gives the true 75/25 split of `hidden_alpha` and `hidden_beta`.
//!
//! The same library's debug file from a local debuginfod (Debian's server), in a `profile`
//! session and in the daemon.
//!
//! The build id is read by `readelf -n`, the `htlhash` computed by Python's `hashlib`, the files
//! decoded by the independent decoders: none of it by spanprof's own code.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use spanprof_tests::{
    decode_pprof, google_pprof, otlp, profile_pid, profiling_lock, python, require_profiling,
    workloads_dir, TempDir, Workload,
};

const LIBRARY: &str = "libspanprof_hidden.so";

/// The GNU build id `readelf -n` prints for `path`, which must have one.
fn readelf_build_id(path: &Path) -> String {
    spanprof_tests::rootfs::readelf_build_id(path)
        .unwrap_or_else(|| panic!("readelf -n prints no build id for {}", path.display()))
}

/// OpenTelemetry's `htlhash` of `path`, by Python's hashlib as the specification spells it.
fn python_htlhash(path: &Path) -> String {
    let script = "import hashlib, sys\n\
        d = open(sys.argv[1], 'rb').read()\n\
        h = hashlib.sha256(d[:4096] + d[-4096:] + len(d).to_bytes(8, 'big'))\n\
        print(h.hexdigest()[:32])";
    let out = Command::new(python())
        .args(["-c", script])
        .arg(path)
        .output()
        .expect("python runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `pprof -top` of `profile` with `PPROF_BINARY_PATH=bins`: its text, and each row's name,
/// flat and cumulative percentages.
fn pprof_top(profile: &Path, bins: &Path) -> (String, Vec<(String, f64, f64)>) {
    let out = Command::new(google_pprof())
        .args(["-top", "-nodecount=50"])
        .arg(profile)
        .env("PPROF_BINARY_PATH", bins)
        // NB: pprof writes its cache and looks for binaries under $HOME/pprof otherwise.
        .env("HOME", bins)
        .output()
        .expect("Google's pprof runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "pprof -top failed:\n{text}");
    // Rows: flat flat% sum% cum cum% name
    let rows = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 6 || !f[1].ends_with('%') || !f[4].ends_with('%') {
                return None;
            }
            let flat: f64 = f[1].trim_end_matches('%').parse().ok()?;
            let cum: f64 = f[4].trim_end_matches('%').parse().ok()?;
            Some((f[5..].join(" "), flat, cum))
        })
        .collect();
    (text, rows)
}

#[test]
fn a_stripped_library_is_named_by_pprof_from_the_copy_its_build_id_finds() {
    require_profiling();
    let workloads = workloads_dir();
    let stripped = workloads.join(LIBRARY);
    let unstripped = workloads.join("unstripped").join(LIBRARY);
    let build_id = readelf_build_id(&stripped);
    assert_eq!(
        build_id,
        readelf_build_id(&unstripped),
        "strip kept the build id"
    );
    let htlhash = python_htlhash(&stripped);

    let _lock = profiling_lock();
    let tmp = TempDir::new("build-ids");
    let pprof = tmp.join("out.pb.gz");
    let otlp_file = tmp.join("out.otlp");
    let workload = Workload::start("hidden_main", 10.0);
    let out = profile_pid(workload.pid(), "2s", 499, &[&pprof, &otlp_file], &[]);
    drop(workload);
    out.assert_success();

    // pprof, by the independent decoder: the library's mapping has its build id, and its
    // frames are addresses without a name.
    let decoded = decode_pprof(&pprof);
    let mappings: Vec<&Value> = decoded["mappings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["filename"].as_str().is_some_and(|f| f.ends_with(LIBRARY)))
        .collect();
    assert_eq!(mappings.len(), 1, "{:#}", decoded["mappings"]);
    assert_eq!(mappings[0]["build_id"], build_id.as_str());
    let mut library_frames = 0;
    let mut total = 0i64;
    for sample in decoded["samples"].as_array().unwrap() {
        total += sample["values"][0].as_i64().unwrap();
        for frame in sample["stack"].as_array().unwrap() {
            if frame["mapping"]
                .as_str()
                .is_some_and(|m| m.ends_with(LIBRARY))
            {
                library_frames += 1;
                assert!(
                    frame["function"].is_null() && frame["line"].is_null(),
                    "a frame of the stripped library has a line: {frame}"
                );
            }
        }
    }
    assert!(total >= 300, "only {total} samples\n{out}");
    assert!(library_frames > 0, "no frame in {LIBRARY}\n{out}");

    // Google's pprof, with the unstripped copy where PPROF_BINARY_PATH has it by build id.
    let bins = tmp.join("bins");
    std::fs::create_dir_all(bins.join(&build_id)).unwrap();
    std::fs::copy(&unstripped, bins.join(&build_id).join(LIBRARY)).unwrap();
    let (text, rows) = pprof_top(&pprof, &bins);
    assert!(
        text.lines().next() == Some("File: hidden_main"),
        "pprof's File: is not the executable:\n{text}"
    );
    let flat = |name: &str| rows.iter().find(|r| r.0 == name).map_or(0.0, |r| r.1);
    let (alpha, beta) = (flat("hidden_alpha"), flat("hidden_beta"));
    assert!(
        alpha + beta >= 90.0,
        "pprof names {alpha}% + {beta}% of the samples hidden_alpha/hidden_beta:\n{text}"
    );
    let split = 100.0 * alpha / (alpha + beta);
    assert!(
        (split - 75.0).abs() <= 5.0,
        "hidden_alpha is {split:.1}% of the library's time, truth 75%:\n{text}"
    );

    // Without the copy, the names are nowhere: they came from the file the build id found.
    let empty = tmp.join("no-bins");
    std::fs::create_dir_all(&empty).unwrap();
    let (text, _) = pprof_top(&pprof, &empty);
    assert!(
        !text.contains("hidden_alpha") && !text.contains("hidden_beta"),
        "pprof names the hidden functions without their copy:\n{text}"
    );

    // OTLP, by the independent decoder: the mapping has both ids; no line on its frames.
    let decoded = otlp::decode_file(&otlp_file);
    otlp::assert_valid(&decoded);
    let mut seen = 0;
    for (_, profile) in otlp::profiles(&decoded) {
        for sample in profile["samples"].as_array().into_iter().flatten() {
            for frame in sample["frames"].as_array().into_iter().flatten() {
                if !frame["mapping"]
                    .as_str()
                    .is_some_and(|m| m.ends_with(LIBRARY))
                {
                    continue;
                }
                seen += 1;
                let attrs = &frame["mapping_attributes"];
                assert_eq!(
                    attrs["process.executable.build_id.gnu"],
                    build_id.as_str(),
                    "{frame}"
                );
                assert_eq!(
                    attrs["process.executable.build_id.htlhash"],
                    htlhash.as_str(),
                    "{frame}"
                );
                assert_eq!(frame["function"], "", "{frame}");
            }
        }
    }
    assert!(seen > 0, "no OTLP frame in {LIBRARY}");
}

/// A local `debuginfod` (Debian's elfutils server) serving the files of `dir` by build id;
/// killed when dropped.
struct DebuginfodServer {
    child: std::process::Child,
    url: String,
}

impl DebuginfodServer {
    /// One serving the unstripped copy of the hidden library (build id `build_id`) from a
    /// directory in `tmp`.
    fn serving_the_library(tmp: &TempDir, build_id: &str) -> DebuginfodServer {
        let served = tmp.join("served");
        std::fs::create_dir_all(&served).unwrap();
        std::fs::copy(
            workloads_dir().join("unstripped").join(LIBRARY),
            served.join(LIBRARY),
        )
        .unwrap();
        DebuginfodServer::start(&served, &tmp.join("db.sqlite"), build_id)
    }

    /// Starts one and waits until it serves `build_id` (it scans `dir` at start).
    fn start(dir: &Path, db: &Path, build_id: &str) -> DebuginfodServer {
        let port = spanprof_tests::daemon::free_port();
        let child = Command::new("debuginfod")
            .args(["-p", &port.to_string(), "-F"])
            .arg(dir)
            .arg("-d")
            .arg(db)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                spanprof_tests::missing_prerequisite(
                    &format!("debuginfod ({e})"),
                    "`cargo xtask deps` (installs Debian's debuginfod)",
                )
            });
        let server = DebuginfodServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while http_status(port, &format!("/buildid/{build_id}/debuginfo")) != Some(200) {
            assert!(
                std::time::Instant::now() < deadline,
                "debuginfod on port {port} did not serve {build_id} within 60 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        server
    }
}

impl Drop for DebuginfodServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status of `GET path` on 127.0.0.1:`port`, by hand (HTTP/1.0: the server closes).
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

#[test]
fn debuginfod_names_a_stripped_library_in_every_format() {
    require_profiling();
    let workloads = workloads_dir();
    let stripped = workloads.join(LIBRARY);
    let build_id = readelf_build_id(&stripped);
    let tmp = TempDir::new("debuginfod");
    let server = DebuginfodServer::serving_the_library(&tmp, &build_id);

    let _lock = profiling_lock();
    let cache = tmp.join("cache");
    let url = server.url.clone();
    let outputs = [
        "out.folded",
        "out.svg",
        "out.pb.gz",
        "out.speedscope.json",
        "out.otlp",
    ]
    .map(|name| tmp.join(name));
    let run = |label: &str| {
        let mut cmd = spanprof_tests::spanprof_command(["profile", "-F", "499", "--no-kernel"]);
        for out in &outputs {
            cmd.arg("-o").arg(out);
        }
        cmd.arg("--")
            .arg(workloads.join("hidden_main"))
            .arg("2")
            .env("DEBUGINFOD_URLS", &url)
            .env("XDG_CACHE_HOME", &cache);
        let out = spanprof_tests::run_with_timeout(cmd, spanprof_tests::RUN_TIMEOUT);
        out.assert_success();
        eprintln!("{label}: {}", out.stderr);
        out
    };
    let out = run("first run");
    assert!(
        out.stderr
            .contains("1 debug files fetched, 0 from the cache, 0 not found"),
        "{out}"
    );
    let cached = cache
        .join("spanprof/debuginfod")
        .join(&build_id)
        .join("debuginfo");
    assert!(cached.is_file(), "no {}", cached.display());

    // Folded: the true split.
    let stacks = spanprof_tests::read_folded(&outputs[0]);
    let total = spanprof_tests::folded_total(&stacks);
    let leaf = |name: &str| {
        spanprof_tests::folded_count(&stacks, |s| s.frames.last().is_some_and(|f| f == name))
    };
    let (alpha, beta) = (leaf("hidden_alpha"), leaf("hidden_beta"));
    let top = spanprof_tests::folded_summary(&stacks, 10);
    assert!(
        (alpha + beta) as f64 >= 0.9 * total as f64,
        "{alpha} + {beta} of {total} samples in hidden_alpha/hidden_beta:\n{top}"
    );
    let split = 100.0 * alpha as f64 / (alpha + beta) as f64;
    assert!(
        (split - 75.0).abs() <= 5.0,
        "hidden_alpha {split:.1}%:\n{top}"
    );
    assert!(
        stacks
            .iter()
            .all(|s| s.frames.iter().all(|f| !f.contains(LIBRARY))),
        "an address of {LIBRARY} is still unnamed:\n{top}"
    );
    // Every other format names them.
    let svg = std::fs::read_to_string(&outputs[1]).unwrap();
    let speedscope = std::fs::read_to_string(&outputs[3]).unwrap();
    for name in ["hidden_alpha", "hidden_beta", "hidden_dispatch"] {
        assert!(
            svg.contains(&format!("<title>{name} (")),
            "SVG lacks {name}"
        );
        assert!(
            speedscope.contains(&format!("\"name\":\"{name}\"")),
            "speedscope lacks {name}"
        );
    }
    let pprof = decode_pprof(&outputs[2]);
    let pprof_names: Vec<&str> = pprof["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    let decoded = otlp::decode_file(&outputs[4]);
    otlp::assert_valid(&decoded);
    let otlp_names = otlp_names(&decoded);
    for name in ["hidden_alpha", "hidden_beta", "hidden_dispatch"] {
        assert!(pprof_names.contains(&name), "pprof lacks {name}");
        assert!(otlp_names.iter().any(|n| n == name), "OTLP lacks {name}");
    }

    // Again with the server gone: the cache serves it.
    drop(server);
    let out = run("second run");
    assert!(
        out.stderr
            .contains("0 debug files fetched, 1 from the cache"),
        "{out}"
    );
    let stacks = spanprof_tests::read_folded(&outputs[0]);
    assert!(
        spanprof_tests::folded_count(&stacks, |s| s.frames.iter().any(|f| f == "hidden_alpha")) > 0,
        "hidden_alpha not named from the cache"
    );
}

/// Google's pprof on a Python profile (pyenv's 3.12, whose interpreter is in
/// `libpython3.12.so`): `File:` is the target's executable, no row collects unnamed addresses
/// under a made-up `[unknown]` name, and Python functions have their `def` line as
/// `start_line`.
#[test]
fn pprof_reads_a_python_profile_as_go_tools_expect() {
    require_profiling();
    let python = spanprof_tests::pyenv_python(12);
    let source = spanprof_tests::py_workload_source("py_split.py");
    let text = std::fs::read_to_string(&source).unwrap();
    let def_line = |name: &str| {
        1 + text
            .lines()
            .position(|l| l.starts_with(&format!("def {name}(")))
            .unwrap_or_else(|| panic!("no def {name} in {}", source.display())) as i64
    };
    let _lock = profiling_lock();
    let tmp = TempDir::new("pprof-python");
    let pprof = tmp.join("py.pb.gz");
    let workload = spanprof_tests::start_py_workload(&python, "py_split.py", &["10"]);
    let out = profile_pid(workload.pid(), "2s", 199, &[&pprof], &[]);
    drop(workload);
    out.assert_success();

    let decoded = decode_pprof(&pprof);
    let functions = decoded["functions"].as_array().unwrap();
    for name in ["alpha", "gamma"] {
        let f = functions
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no function {name}: {functions:?}"));
        assert_eq!(f["start_line"].as_i64(), Some(def_line(name)), "{f}");
    }
    assert!(
        !functions.iter().any(|f| f["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("[unknown]"))),
        "a made-up [unknown] function: {functions:?}"
    );

    let no_bins = tmp.join("no-bins");
    std::fs::create_dir_all(&no_bins).unwrap();
    let (top, rows) = pprof_top(&pprof, &no_bins);
    let exe = std::fs::canonicalize(&python).unwrap();
    let exe = exe.file_name().unwrap().to_string_lossy();
    assert_eq!(
        top.lines().next(),
        Some(format!("File: {exe}").as_str()),
        "{top}"
    );
    assert!(
        !rows.iter().any(|r| r.0.starts_with("[unknown]")),
        "an [unknown] row:\n{top}"
    );
    // The workload's truth: alpha 50% of the CPU, gamma 20% (under them, the interpreter's
    // native frames have the flat time).
    let cum = |name: &str| rows.iter().find(|r| r.0 == name).map_or(0.0, |r| r.2);
    assert!(
        (cum("alpha") - 50.0).abs() <= 10.0 && (cum("gamma") - 20.0).abs() <= 10.0,
        "alpha {}%, gamma {}% cumulative (truth 50, 20):\n{top}",
        cum("alpha"),
        cum("gamma")
    );
}

/// The function names of the frames of every OTLP file in `bins`, one set per file.
fn otlp_function_names(bins: &[std::path::PathBuf]) -> Vec<Vec<String>> {
    bins.iter()
        .map(|bin| {
            let decoded = otlp::decode_file(bin);
            otlp::assert_valid(&decoded);
            otlp_names(&decoded)
        })
        .collect()
}

/// The function names of every frame of a decoded OTLP file.
fn otlp_names(decoded: &Value) -> Vec<String> {
    otlp::profiles(decoded)
        .into_iter()
        .flat_map(|(_, p)| p["samples"].as_array().cloned().unwrap_or_default())
        .flat_map(|s| {
            otlp::functions(&s)
                .into_iter()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `spanprof daemon` with `[symbols] debuginfod_urls`: the stripped library's debug file is
/// downloaded in the background (into `debuginfod_cache`, mode 0600) and its functions are named
/// in the windows exported after it arrived; the daemon says what it fetched.
#[test]
fn the_daemon_names_a_stripped_library_from_its_debuginfod_servers() {
    require_profiling();
    let workloads = workloads_dir();
    let build_id = readelf_build_id(&workloads.join(LIBRARY));
    let tmp = TempDir::new("daemon-debuginfod");
    let server = DebuginfodServer::serving_the_library(&tmp, &build_id);

    let _lock = profiling_lock();
    let sink = otlp::HttpSink::start();
    let workload = Workload::start("hidden_main", 30.0);
    let cache = tmp.join("cache");
    let daemon = spanprof_tests::daemon::Daemon::start(
        &tmp,
        &format!(
            "[sampling]\nfrequency = 199\nwindow = \"1s\"\n[scope]\npids = [{}]\n\
             [export]\nprotocol = \"http/protobuf\"\nendpoint = \"{}\"\n\
             [symbols]\ndebuginfod_urls = [\"{}\"]\ndebuginfod_cache = \"{}\"\n",
            workload.pid(),
            sink.endpoint(),
            server.url,
            cache.display()
        ),
    );
    // Windows of 1 s: the first ones leave the library's frames as addresses while the file
    // downloads; wait for one that names them (at most 20 windows).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let named = |names: &Vec<String>| {
        ["hidden_alpha", "hidden_beta"]
            .iter()
            .all(|f| names.iter().any(|n| n == f))
    };
    let mut windows = Vec::new();
    while std::time::Instant::now() < deadline {
        windows = otlp_function_names(&sink.requests());
        if windows.iter().any(named) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let stderr = daemon.stop();
    drop(workload);
    eprintln!(
        "windows exported: {}; the first naming hidden_alpha and hidden_beta: {:?}",
        windows.len(),
        windows.iter().position(named).map(|i| i + 1)
    );
    assert!(
        windows.iter().any(named),
        "no window of {} names hidden_alpha and hidden_beta:\n{windows:?}\n{stderr}",
        windows.len()
    );
    assert!(
        stderr.contains(&format!(
            "debuginfod: 1 debug files fetched into {}, 0 not found",
            cache.display()
        )),
        "{stderr}"
    );
    let cached = cache.join(&build_id).join("debuginfo");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&cached)
            .unwrap_or_else(|e| panic!("{}: {e}", cached.display()))
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "{}", cached.display());
}
