//! Privacy controls: what a profile may say about the machine and the code before it is
//! written, re-rendered or exported.
//!
//! # Overview
//! Profiles name source files, modules and command lines, whose directories tell user names,
//! checkout locations and deployment layout; and labels tie samples to threads and requests.
//! [`Privacy::apply`] changes the [`Profile`] once, before any sink sees it, so that every
//! format says the same:
//! - `--redact-paths` ([`PathMode`]): every path (module files, source files, the executable,
//!   the target and command line, notes) keeps its base name only, or its base name behind a
//!   hash of its directory (`<3f2a9c1b>/libc.so.6`), so that files of the same name in two
//!   directories stay apart.
//! - `--drop-label KEY` ([`DROPPABLE`]): the label is left out of pprof samples and OTLP
//!   samples, links and resources; thread names and span fields are also cleared in the profile,
//!   so that no other format (speedscope's thread names, `--group-by span`) shows them.
//!
//! # Design constraints
//! The directory hash is an unkeyed SHA-256, a pseudonym stable across runs (so that diffs of
//! two redacted runs line up), not a secret: a directory anyone can guess can be hashed and
//! compared.

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

use crate::profile::{labels, Profile};

/// How `--redact-paths` rewrites a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathMode {
    /// `/usr/lib/x86_64-linux-gnu/libc.so.6` → `libc.so.6`.
    Basename,
    /// `/usr/lib/x86_64-linux-gnu/libc.so.6` → `<hash of the directory>/libc.so.6`.
    Hash,
}

impl PathMode {
    /// `basename` or `hash`.
    pub fn from_name(name: &str) -> Option<PathMode> {
        match name {
            "basename" => Some(PathMode::Basename),
            "hash" => Some(PathMode::Hash),
            _ => None,
        }
    }
}

/// Sample labels (pprof) and sample attributes (OTLP) `--drop-label` takes.
pub const SAMPLE_LABELS: [&str; 14] = [
    "thread.id",
    "thread.name",
    "process.id",
    crate::format::pprof::UNWIND_LABEL,
    crate::format::pprof::UNWIND_REASON_LABEL,
    crate::format::pprof::OFF_CPU_REASON_LABEL,
    labels::TRACE_ID,
    labels::SPAN_ID,
    labels::SPAN_NAME,
    labels::OSP_BASE_ID,
    labels::OSP_TRACE_ID,
    labels::OSP_PARENT_ID,
    labels::OSP_NAME,
    labels::IDS_FROM,
];

/// Resource attributes (OTLP) and run facts (pprof comments) `--drop-label` takes.
pub const RESOURCE_LABELS: [&str; 7] = [
    "process.command_line",
    "process.executable.path",
    "host.name",
    "host.id",
    "container.id",
    "vcs.ref.head.revision",
    "vcs.ref.head.name",
];

/// Every key `--drop-label` takes.
pub const DROPPABLE: [&str; 21] = {
    let mut all = [""; 21];
    let mut i = 0;
    while i < SAMPLE_LABELS.len() {
        all[i] = SAMPLE_LABELS[i];
        i += 1;
    }
    let mut j = 0;
    while j < RESOURCE_LABELS.len() {
        all[i + j] = RESOURCE_LABELS[j];
        j += 1;
    }
    all
};

/// What to hide of a profile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Privacy {
    /// `--redact-paths`: how paths are rewritten; `None` keeps them.
    pub redact_paths: Option<PathMode>,
    /// `--drop-label`: keys of [`DROPPABLE`] to leave out.
    pub drop_labels: BTreeSet<String>,
}

/// What the command line dropped leaves of the target's description.
pub const DROPPED_TARGET: &str = "[command line dropped]";

impl Privacy {
    /// Checks a `--drop-label` key.
    pub fn parse_label(key: &str) -> Result<String, String> {
        let key = key.trim();
        if DROPPABLE.contains(&key) {
            Ok(key.to_string())
        } else {
            Err(format!(
                "--drop-label '{key}': not a label spanprof writes; one of {}",
                DROPPABLE.join(", ")
            ))
        }
    }

    /// True when nothing is to be hidden.
    pub fn is_empty(&self) -> bool {
        self.redact_paths.is_none() && self.drop_labels.is_empty()
    }

    /// Rewrites `profile` as asked: paths redacted everywhere, dropped labels recorded in its
    /// [`crate::profile::Meta::dropped_labels`] for the sinks, and the fields only they
    /// describe cleared.
    pub fn apply(&self, profile: &mut Profile) {
        if let Some(mode) = self.redact_paths {
            redact_profile(profile, mode);
        }
        if self.drop_labels.is_empty() {
            return;
        }
        let dropped = |k: &str| self.drop_labels.contains(k);
        let meta = &mut profile.meta;
        for key in &self.drop_labels {
            if !meta.dropped_labels.contains(key) {
                meta.dropped_labels.push(key.clone());
            }
        }
        meta.dropped_labels.sort();
        if dropped("process.command_line") {
            meta.target = DROPPED_TARGET.to_string();
            for p in &mut profile.processes {
                p.info.command_line = None;
            }
        }
        if dropped("process.executable.path") {
            for p in &mut profile.processes {
                p.info.exe_path = None;
            }
        }
        if dropped("host.name") || dropped("host.id") {
            if let Some(host) = &mut meta.host {
                if dropped("host.name") {
                    host.name.clear();
                }
                if dropped("host.id") {
                    host.id = None;
                }
            }
        }
        if dropped("container.id") {
            for p in &mut profile.processes {
                p.info.container_id = None;
            }
        }
        if dropped("vcs.ref.head.revision") {
            meta.build.commit = None;
        }
        if dropped("vcs.ref.head.name") {
            meta.build.branch = None;
        }
        if dropped("thread.name") {
            for t in &mut profile.threads {
                t.name.clear();
            }
        }
        for span in &mut profile.spans {
            if dropped(labels::TRACE_ID) {
                span.trace_id = None;
            }
            if dropped(labels::SPAN_ID) {
                span.span_id = None;
            }
            if dropped(labels::SPAN_NAME) {
                span.span_name = None;
            }
            if dropped(labels::OSP_NAME) {
                span.osprofiler_name = None;
            }
            if let Some(o) = &mut span.osprofiler {
                if dropped(labels::OSP_PARENT_ID) {
                    o.parent_id = None;
                }
            }
            // NB: the ids come as a pair (a reader refuses one without the other): dropping
            // either drops both.
            if dropped(labels::OSP_BASE_ID) || dropped(labels::OSP_TRACE_ID) {
                span.osprofiler = None;
            }
        }
    }
}

/// `path` as [`PathMode`] says; a name without a directory is kept as it is.
pub fn redact_path(path: &str, mode: PathMode) -> String {
    // NB: " (deleted)" and similar suffixes of /proc paths follow a space: only the path
    // itself is rewritten by `redact_text`; here the whole string is one path.
    let Some(slash) = path.rfind('/') else {
        return path.to_string();
    };
    let (dir, base) = (&path[..slash], &path[slash + 1..]);
    match mode {
        PathMode::Basename => base.to_string(),
        // Redacting a redacted profile again changes nothing.
        PathMode::Hash if is_hashed(dir) => path.to_string(),
        PathMode::Hash => {
            let digest = Sha256::digest(dir.as_bytes());
            let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
            format!("<{hex}>/{base}")
        }
    }
}

/// Free text (a command line, a note) with every path in it redacted: a path is a run of
/// characters holding a `/` between spaces and the punctuation around paths (`=`, `,`, `:`,
/// `(`, `)`, `[`, `]`, quotes), so `--include=/a/x,/b/y` keeps its option and both base names.
pub fn redact_text(text: &str, mode: PathMode) -> String {
    const AROUND: [char; 10] = [' ', '=', ',', ':', '(', ')', '[', ']', '\'', '"'];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.find(AROUND).unwrap_or(rest.len());
        let (piece, tail) = rest.split_at(end);
        if piece.contains('/') {
            out.push_str(&redact_path(piece, mode));
        } else {
            out.push_str(piece);
        }
        // The separator itself, then what follows.
        let mut chars = tail.chars();
        if let Some(c) = chars.next() {
            out.push(c);
        }
        rest = chars.as_str();
    }
    out
}

/// A path that [`redact_path`] in hash mode already wrote: `<8 hex digits>/name`.
fn is_hashed(dir: &str) -> bool {
    dir.len() == 10
        && dir.starts_with('<')
        && dir.ends_with('>')
        && dir[1..9].bytes().all(|b| b.is_ascii_hexdigit())
}

fn redact_profile(profile: &mut Profile, mode: PathMode) {
    let path = |p: &mut String| *p = redact_path(p, mode);
    let text = |t: &mut String| *t = redact_text(t, mode);
    for f in &mut profile.frames {
        if let Some(m) = &mut f.module {
            // NB: "[kernel.kallsyms]", "[python]", "[vdso]" have no directory.
            path(m);
        }
        if let Some(file) = &mut f.file {
            path(file);
        }
        if let Some(reason) = &mut f.unknown_reason {
            text(reason);
        }
    }
    text(&mut profile.meta.target);
    for note in &mut profile.meta.python.notes {
        text(note);
    }
    for p in &mut profile.processes {
        text(&mut p.name);
        if let Some(exe) = &mut p.info.exe_path {
            // One path, spaces and all; /proc's " (deleted)" stays a suffix.
            *exe = match exe.strip_suffix(" (deleted)") {
                Some(file) => format!("{} (deleted)", redact_path(file, mode)),
                None => redact_path(exe, mode),
            };
        }
        if let Some(cmd) = &mut p.info.command_line {
            text(cmd);
        }
        for (_, value) in &mut p.info.env_attributes {
            text(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fixture;
    use std::io::Read;

    #[test]
    fn paths_keep_their_base_name_or_a_hash_of_their_directory() {
        let b = PathMode::Basename;
        assert_eq!(
            redact_path("/usr/lib/x86_64-linux-gnu/libc.so.6", b),
            "libc.so.6"
        );
        assert_eq!(redact_path("libc.so.6", b), "libc.so.6");
        assert_eq!(redact_path("[kernel.kallsyms]", b), "[kernel.kallsyms]");
        assert_eq!(redact_path("/srv/app/", b), "");
        let h = redact_path("/usr/lib/x86_64-linux-gnu/libc.so.6", PathMode::Hash);
        assert!(
            h.ends_with(">/libc.so.6") && h.starts_with('<') && h.len() == 20,
            "{h}"
        );
        assert!(!h.contains("usr") && !h.contains("x86_64"), "{h}");
        // Stable, and apart for another directory.
        assert_eq!(
            h,
            redact_path("/usr/lib/x86_64-linux-gnu/libc.so.6", PathMode::Hash)
        );
        assert_ne!(h, redact_path("/opt/lib/libc.so.6", PathMode::Hash));
    }

    #[test]
    fn text_has_each_path_redacted_and_its_punctuation_kept() {
        let b = PathMode::Basename;
        assert_eq!(
            redact_text(
                "/usr/bin/python3 /srv/nova/api.py --config=/etc/nova/nova.conf -v",
                b
            ),
            "python3 api.py --config=nova.conf -v"
        );
        assert_eq!(
            redact_text("pid 12 (/home/alice/bin/app) and 'x/y', done", b),
            "pid 12 (app) and 'y', done"
        );
        assert_eq!(redact_text("no paths here", b), "no paths here");
        assert_eq!(
            redact_text(
                "--include=/home/alice/a,/home/alice/b x=/a/b\"/home/alice/c\"",
                b
            ),
            "--include=a,b x=b\"c\""
        );
        assert_eq!(
            redact_text("PATH=/usr/bin:/home/alice/bin", b),
            "PATH=bin:bin"
        );
        // Hash mode twice is hash mode once.
        let once = redact_text("/srv/app/main.py --log=/var/log/app.log", PathMode::Hash);
        assert_eq!(redact_text(&once, PathMode::Hash), once);
        assert!(!once.contains("srv") && !once.contains("var"), "{once}");
        assert_eq!(redact_text("", b), "");
        // Never a panic on odd text.
        for odd in ["/", "//", "=/", "(/)", "a/(b", "é/ü", "'/'"] {
            let _ = redact_text(odd, PathMode::Hash);
        }
    }

    #[test]
    fn drop_label_keys_are_checked() {
        assert_eq!(
            Privacy::parse_label(" thread.name "),
            Ok("thread.name".into())
        );
        let err = Privacy::parse_label("thread").unwrap_err();
        assert!(err.contains("thread.id, thread.name"), "{err}");
        assert_eq!(DROPPABLE.iter().filter(|k| k.is_empty()).count(), 0);
    }

    #[test]
    fn dropped_labels_stay_dropped_when_a_profile_is_read_back() {
        use crate::format::{self, Format};
        let mut profile = fixture::profile();
        let privacy = Privacy {
            drop_labels: ["thread.id", "process.id", "thread.name"]
                .map(String::from)
                .into(),
            ..Privacy::default()
        };
        privacy.apply(&mut profile);
        let bytes = format::render(&profile, Format::Pprof).unwrap();
        let back = crate::format::pprof::read_pprof(&bytes).unwrap();
        assert_eq!(back.meta.dropped_labels, profile.meta.dropped_labels);
        assert!(back.threads.iter().all(|t| t.tid == 0 && t.name.is_empty()));
        // Written again, the labels are still left out.
        let again = format::render(&back, Format::Pprof).unwrap();
        let again = crate::format::pprof::read_pprof(&again).unwrap();
        assert_eq!(again.meta.dropped_labels, profile.meta.dropped_labels);
        let raw = {
            use ::pprof::protos::Message as _;
            let mut bytes = Vec::new();
            let rendered = format::render(&back, Format::Pprof).unwrap();
            flate2::read::GzDecoder::new(&rendered[..])
                .read_to_end(&mut bytes)
                .unwrap();
            ::pprof::protos::Profile::decode(bytes.as_slice()).unwrap()
        };
        let keys: std::collections::BTreeSet<&str> = raw
            .sample
            .iter()
            .flat_map(|s| &s.label)
            .map(|l| raw.string_table[l.key as usize].as_str())
            .collect();
        for key in ["thread.id", "process.id", "thread.name"] {
            assert!(!keys.contains(key), "{key} in {keys:?}");
        }
        assert!(raw
            .string_table
            .iter()
            .any(|c| c == "dropped labels: process.id, thread.id, thread.name"));
        // A file without the comment and without the labels is not spanprof's.
        let mut plain = fixture::profile();
        plain.meta.dropped_labels = vec!["thread.id".to_string()];
        let bytes = format::render(&plain, Format::Pprof).unwrap();
        assert!(crate::format::pprof::read_pprof(&bytes).is_ok());
    }

    #[test]
    fn apply_redacts_every_path_of_a_profile() {
        let mut profile = fixture::profile();
        let privacy = Privacy {
            redact_paths: Some(PathMode::Basename),
            ..Privacy::default()
        };
        privacy.apply(&mut profile);
        let debug = format!("{profile:?}");
        assert!(
            !debug.contains("/usr/") && !debug.contains("/src/"),
            "{debug}"
        );
    }
}
