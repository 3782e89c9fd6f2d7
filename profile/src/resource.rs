//! Who a profile's samples belong to: the OpenTelemetry resource of each process and of the host.
//!
//! A process is described once, when its first sample arrives, from `/proc/PID`: the executable
//! (`exe`), the command line (`cmdline`), the service name from its own environment
//! (`OTEL_SERVICE_NAME`, else `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, as the OpenTelemetry
//! SDKs read them; else `unknown_service:` and the executable's name, as an SDK says it), the
//! other `OTEL_RESOURCE_ATTRIBUTES`, and the container
//! from its cgroup path. The host is described once per session. [`resource_attributes`] turns
//! both into the attributes of an OTLP `Resource`, named as the semantic conventions name them.
//!
//! Everything here is read from files the profiled process controls (its environment and
//! command line): each read is bounded, invalid UTF-8 is replaced, and malformed entries are
//! skipped, never an error.

use std::io::Read;

/// Bytes read at most from `/proc/PID/environ` and `/proc/PID/cmdline`.
const MAX_PROC_FILE: u64 = 256 * 1024;
/// Longest attribute value kept from the environment or the command line (bytes).
const MAX_VALUE: usize = 4096;
/// Attributes kept at most from `OTEL_RESOURCE_ATTRIBUTES`.
const MAX_ENV_ATTRIBUTES: usize = 64;

/// What a process says about itself, for its resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    /// `/proc/PID/exe`: the executable's path.
    pub exe_path: Option<String>,
    /// The arguments, joined by spaces.
    pub command_line: Option<String>,
    /// `OTEL_SERVICE_NAME`, or `service.name` of `OTEL_RESOURCE_ATTRIBUTES`.
    pub service_name: Option<String>,
    /// The other `OTEL_RESOURCE_ATTRIBUTES`, in their order, percent-decoded.
    pub env_attributes: Vec<(String, String)>,
    /// The container id, from the cgroup path (Docker, containerd, CRI-O, Podman).
    pub container_id: Option<String>,
    /// The language runtime, e.g. (`cpython`, `3.11.2`), once it was recognized.
    pub runtime: Option<(String, String)>,
}

/// The host a session ran on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostInfo {
    /// Host name (`uname -n`).
    pub name: String,
    /// `/etc/machine-id` (the semantic conventions' `host.id` on Linux), when readable.
    pub id: Option<String>,
}

/// An attribute value: the resource has strings and integers only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A string.
    Str(String),
    /// A signed integer.
    Int(i64),
}

impl HostInfo {
    /// This host.
    pub fn current() -> HostInfo {
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let id = std::fs::read_to_string("/etc/machine-id")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        HostInfo { name, id }
    }
}

impl ProcessInfo {
    /// Reads what `/proc/PID` says; whatever cannot be read (the process exited, no
    /// permission) stays `None`.
    pub fn read(pid: u32) -> ProcessInfo {
        let exe_path = read_exe(pid);
        let command_line = read_bounded(&format!("/proc/{pid}/cmdline"))
            .map(|raw| join_args(&raw))
            .filter(|s| !s.is_empty());
        let mut info = ProcessInfo {
            exe_path,
            command_line,
            ..ProcessInfo::default()
        };
        if let Some(environ) = read_bounded(&format!("/proc/{pid}/environ")) {
            info.set_environment(&environ);
        }
        if let Ok(cgroup) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
            info.container_id = container_id(&cgroup);
        }
        info
    }

    /// Takes the service name and resource attributes from a NUL-separated environment.
    fn set_environment(&mut self, environ: &[u8]) {
        let mut service = None;
        let mut attributes = None;
        for entry in environ.split(|&b| b == 0) {
            if let Some(v) = entry.strip_prefix(b"OTEL_SERVICE_NAME=") {
                service = Some(lossy(v));
            } else if let Some(v) = entry.strip_prefix(b"OTEL_RESOURCE_ATTRIBUTES=") {
                attributes = Some(lossy(v));
            }
        }
        let mut attrs = attributes
            .as_deref()
            .map(parse_resource_attributes)
            .unwrap_or_default();
        let from_attrs = attrs
            .iter()
            .position(|(k, _)| k == "service.name")
            .map(|i| attrs.remove(i).1);
        self.service_name = service
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .or(from_attrs);
        self.env_attributes = attrs;
    }
}

/// Reads at most [`MAX_PROC_FILE`] bytes of a file.
fn read_bounded(path: &str) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_PROC_FILE)
        .read_to_end(&mut buf)
        .ok()?;
    Some(buf)
}

fn lossy(bytes: &[u8]) -> String {
    let mut s = String::from_utf8_lossy(bytes).into_owned();
    truncate(&mut s);
    s
}

/// Cuts a value to [`MAX_VALUE`] bytes, on a character boundary.
fn truncate(s: &mut String) {
    if s.len() > MAX_VALUE {
        let mut end = MAX_VALUE;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// `/proc/PID/cmdline`'s NUL-separated arguments joined by spaces.
fn join_args(raw: &[u8]) -> String {
    let args: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let mut s = args.join(" ");
    truncate(&mut s);
    s
}

/// `key1=value1,key2=value2` with percent-encoded values (the OpenTelemetry SDK environment
/// variable format). Entries without `=`, with an empty key, or with a bad escape are skipped.
pub fn parse_resource_attributes(s: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in s.split(',') {
        let Some((key, value)) = entry.split_once('=') else {
            continue;
        };
        let key = key.trim();
        let Some(mut value) = percent_decode(value.trim()) else {
            continue;
        };
        if key.is_empty() || out.len() >= MAX_ENV_ATTRIBUTES {
            continue;
        }
        truncate(&mut value);
        // A repeated key: the last one wins.
        out.retain(|(k, _)| k != key);
        out.push((key.to_string(), value));
    }
    out
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The container id in a `/proc/PID/cgroup` file: the last 64-hex-digit id of a path
/// component, as Docker (`/docker/ID`, `docker-ID.scope`), containerd (`cri-containerd-ID`),
/// CRI-O (`crio-ID`) and Podman (`libpod-ID`) name them.
pub fn container_id(cgroup: &str) -> Option<String> {
    let mut found = None;
    for line in cgroup.lines() {
        // `hierarchy-ID:controllers:path`; the path may itself contain ':'.
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        for component in path.split('/') {
            let name = component.strip_suffix(".scope").unwrap_or(component);
            let id = name.rsplit(['-', ':']).next().unwrap_or(name);
            if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
                found = Some(id.to_ascii_lowercase());
            }
        }
    }
    found
}

/// `/proc/PID/exe`, the executable's path, when it can be read.
pub fn read_exe(pid: u32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// The basename of a path.
fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The resource attributes of a process on a host, in a fixed order: `service.name`, the
/// process's own `OTEL_RESOURCE_ATTRIBUTES` (those spanprof does not detect itself), then
/// `process.*`, `process.runtime.*`, `container.id` and `host.*`.
pub fn resource_attributes(
    pid: u32,
    comm: &str,
    info: &ProcessInfo,
    host: Option<&HostInfo>,
) -> Vec<(String, Value)> {
    let exe_name = info
        .exe_path
        .as_deref()
        .map(|p| base(p.strip_suffix(" (deleted)").unwrap_or(p)).to_string())
        .unwrap_or_else(|| comm.to_string());
    // Without one, OpenTelemetry's convention: `unknown_service:` and the executable's name.
    let service = info
        .service_name
        .clone()
        .unwrap_or_else(|| format!("unknown_service:{exe_name}"));
    let mut out = vec![("service.name".to_string(), Value::Str(service))];
    let detected = |k: &str| {
        k == "service.name"
            || k.starts_with("process.")
            || k.starts_with("host.")
            || k == "container.id"
            || k == "os.type"
    };
    for (k, v) in &info.env_attributes {
        if !detected(k) {
            out.push((k.clone(), Value::Str(v.clone())));
        }
    }
    out.push(("process.pid".to_string(), Value::Int(i64::from(pid))));
    out.push((
        "process.executable.name".to_string(),
        Value::Str(exe_name.clone()),
    ));
    if let Some(path) = &info.exe_path {
        out.push((
            "process.executable.path".to_string(),
            Value::Str(path.clone()),
        ));
    }
    if let Some(cmd) = &info.command_line {
        out.push(("process.command_line".to_string(), Value::Str(cmd.clone())));
    }
    if let Some((name, version)) = &info.runtime {
        out.push(("process.runtime.name".to_string(), Value::Str(name.clone())));
        out.push((
            "process.runtime.version".to_string(),
            Value::Str(version.clone()),
        ));
    }
    if let Some(id) = &info.container_id {
        out.push(("container.id".to_string(), Value::Str(id.clone())));
    }
    if let Some(host) = host {
        if !host.name.is_empty() {
            out.push(("host.name".to_string(), Value::Str(host.name.clone())));
        }
        if let Some(id) = &host.id {
            out.push(("host.id".to_string(), Value::Str(id.clone())));
        }
        out.push(("host.arch".to_string(), Value::Str(host_arch().to_string())));
        out.push(("os.type".to_string(), Value::Str("linux".to_string())));
    }
    out
}

/// `host.arch` as the semantic conventions spell it.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "x86",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_attributes_come_from_the_environment_like_the_sdk() {
        let mut info = ProcessInfo::default();
        info.set_environment(
            b"PATH=/bin\0OTEL_RESOURCE_ATTRIBUTES=service.name=from-attrs,deployment.environment=prod%2Ceu, team = a%20b ,bad%zz=1,broken%2=x,badvalue=%2,badvalue2=%zz,=novalue,noeq\0HOME=/root\0",
        );
        assert_eq!(info.service_name.as_deref(), Some("from-attrs"));
        assert_eq!(
            info.env_attributes,
            [
                ("deployment.environment".to_string(), "prod,eu".to_string()),
                ("team".to_string(), "a b".to_string()),
                ("bad%zz".to_string(), "1".to_string()),
                ("broken%2".to_string(), "x".to_string()),
            ]
        );
        // OTEL_SERVICE_NAME wins over the attribute.
        info.set_environment(
            b"OTEL_SERVICE_NAME=nova-api\0OTEL_RESOURCE_ATTRIBUTES=service.name=x\0",
        );
        assert_eq!(info.service_name.as_deref(), Some("nova-api"));
        assert!(info.env_attributes.is_empty());
        // Garbage: no '=' anywhere, invalid UTF-8, a huge value.
        let mut huge = b"OTEL_SERVICE_NAME=".to_vec();
        huge.extend(std::iter::repeat_n(b'x', 100_000));
        huge.extend(b"\0\xff\xfe\0OTEL_RESOURCE_ATTRIBUTES=\xff=\xfe\0");
        info.set_environment(&huge);
        assert_eq!(info.service_name.as_ref().map(String::len), Some(MAX_VALUE));
        assert_eq!(info.env_attributes.len(), 1);
        assert_eq!(info.env_attributes[0].0, "\u{fffd}");
    }

    #[test]
    fn container_ids_of_the_usual_runtimes() {
        let id = "3f4e5d6c7b8a99881122334455667788990011223344556677889900aabbccdd";
        for path in [
            format!("0::/system.slice/docker-{id}.scope"),
            format!("12:memory:/docker/{id}"),
            format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-{id}.scope"),
            format!("0::/machine.slice/libpod-{id}.scope/container"),
            format!("0::/kubepods/burstable/pod1/crio-{id}.scope"),
        ] {
            assert_eq!(container_id(&path).as_deref(), Some(id), "{path}");
        }
        assert_eq!(
            container_id("0::/user.slice/user-0.slice/session-3.scope"),
            None
        );
        assert_eq!(container_id("garbage\n::\n0::"), None);
    }

    #[test]
    fn attributes_in_a_fixed_order_with_detected_ones_winning() {
        let info = ProcessInfo {
            exe_path: Some("/usr/bin/python3.11".to_string()),
            command_line: Some("python3 app.py".to_string()),
            service_name: None,
            env_attributes: vec![
                ("process.pid".to_string(), "1".to_string()),
                ("team".to_string(), "a".to_string()),
            ],
            container_id: None,
            runtime: Some(("cpython".to_string(), "3.11.2".to_string())),
        };
        let host = HostInfo {
            name: "h".to_string(),
            id: Some("abc".to_string()),
        };
        let attrs = resource_attributes(42, "python3", &info, Some(&host));
        let keys: Vec<&str> = attrs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "service.name",
                "team",
                "process.pid",
                "process.executable.name",
                "process.executable.path",
                "process.command_line",
                "process.runtime.name",
                "process.runtime.version",
                "host.name",
                "host.id",
                "host.arch",
                "os.type"
            ]
        );
        assert_eq!(
            attrs[0].1,
            Value::Str("unknown_service:python3.11".to_string())
        );
        assert_eq!(attrs[2].1, Value::Int(42));
    }
}
