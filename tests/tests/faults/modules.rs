//! Module files a profiled process maps that would make the symbolizer allocate without bound
//! (issue 42, item 5 and the zlib bomb of item 6): a compressed `.debug_info` whose header
//! claims 1 TiB (blazesym made a vector of that capacity, and spanprof aborted), and one whose
//! zlib stream inflates to 512 MiB past a 4 MiB claim; and one whose debug link names a 2 GiB
//! file beside it (read whole for its CRC, in the sampling loop). Each is a copy of a small C program
//! built with `-gz=zlib`, its section header patched here, owned by another user (`nobody`);
//! a third, unpatched copy runs beside them.

use std::path::Path;

use spanprof_tests::{parse_folded, profiling_lock, require_root, TempDir};

const SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) static unsigned long burn(unsigned long n) {
    unsigned long x = 7;
    for (unsigned long i = 0; i < n; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}
int main(int argc, char **argv) {
    printf("%lu\n", burn(strtoul(argv[1], 0, 10)));
    return 0;
}
"#;

fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap()) as usize
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The file offset of the ELF64 section header named `name`.
fn section_header(b: &[u8], name: &str) -> usize {
    let (shoff, shent, shnum, shstrndx) = (
        u64_at(b, 0x28) as usize,
        u16_at(b, 0x3a),
        u16_at(b, 0x3c),
        u16_at(b, 0x3e),
    );
    let strtab = u64_at(b, shoff + shstrndx * shent + 0x18) as usize;
    (0..shnum)
        .map(|i| shoff + i * shent)
        .find(|&h| {
            let at = strtab + u32::from_le_bytes(b[h..h + 4].try_into().unwrap()) as usize;
            b[at..].split(|&c| c == 0).next() == Some(name.as_bytes())
        })
        .unwrap_or_else(|| panic!("no section {name}"))
}

#[test]
fn hostile_debug_sections_are_refused_and_the_session_goes_on() {
    require_root();
    let tmp = TempDir::new("hostile-modules");
    let src = tmp.join("burn.c");
    std::fs::write(&src, SOURCE).unwrap();
    let built = tmp.join("cotarget");
    let cc = std::process::Command::new("cc")
        .args(["-O1", "-g", "-gz=zlib", "-o"])
        .arg(&built)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(cc.success(), "cc failed");
    let original = std::fs::read(&built).unwrap();
    let info = section_header(&original, ".debug_info");
    let info_offset = u64_at(&original, info + 0x18) as usize;
    // 1 TiB claimed in the section's Elf64_Chdr (ch_size at 8).
    let mut tib = original.clone();
    tib[info_offset + 8..info_offset + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    // A 4 MiB claim over 512 MiB of zeros, appended, the header pointing at it.
    let mut bomb = original.clone();
    let zeros = vec![0u8; 512 << 20];
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut z, &zeros).unwrap();
    let z = z.finish().unwrap();
    let mut section = Vec::new();
    section.extend_from_slice(&1u32.to_le_bytes());
    section.extend_from_slice(&0u32.to_le_bytes());
    section.extend_from_slice(&(4u64 << 20).to_le_bytes());
    section.extend_from_slice(&1u64.to_le_bytes());
    section.extend_from_slice(&z);
    let at = bomb.len() as u64;
    bomb.extend_from_slice(&section);
    bomb[info + 0x18..info + 0x20].copy_from_slice(&at.to_le_bytes());
    bomb[info + 0x20..info + 0x28].copy_from_slice(&(section.len() as u64).to_le_bytes());
    let write_exe = |name: &str, bytes: &[u8]| {
        use std::os::unix::fs::PermissionsExt;
        let p = tmp.join(name);
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Another user's program: a file of root's outside a container is trusted not to be a
        // bomb (its streams are not inflated to be checked; its claims are).
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        p
    };
    write_exe("hostile_tib", &tib);
    write_exe("hostile_bomb", &bomb);
    // A debug link to `big.debug` next to it, which is then a 2 GiB (sparse) file: read whole
    // for its CRC, it held the sampling loop for 17 s.
    let big = tmp.join("big.debug");
    std::fs::write(&big, b"small for now").unwrap();
    let linked = tmp.join("hostile_link");
    let objcopy = std::process::Command::new("objcopy")
        .current_dir(tmp.path())
        .arg("--add-gnu-debuglink=big.debug")
        .arg(&built)
        .arg(&linked)
        .status()
        .expect("run objcopy");
    assert!(objcopy.success());
    std::fs::File::create(&big)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    std::os::unix::fs::chown(&linked, Some(65534), Some(65534)).unwrap();

    let folded = tmp.join("run.folded");
    let script = format!(
        "cd '{}' || exit 1; ./hostile_tib 300000000 & ./hostile_bomb 300000000 & \
         ./hostile_link 300000000 & ./cotarget 300000000; wait",
        tmp.path().display()
    );
    let words = [
        "profile",
        "-F",
        "499",
        "--group-by",
        "process",
        "-o",
        folded.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ];
    let args: Vec<&std::ffi::OsStr> = words.iter().map(std::ffi::OsStr::new).collect();
    let _lock = profiling_lock();
    // NB: a test thread that forks while this one still holds a fresh executable open for
    // writing makes its exec fail with ETXTBSY until that child execs; run again then.
    let mut run = crate::run_bounded(&args, std::time::Duration::from_secs(120));
    for _ in 0..20 {
        if !run.1.contains("Text file busy") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        run = crate::run_bounded(&args, std::time::Duration::from_secs(120));
    }
    let (code, err, _, peak) = run;
    assert_eq!(code, 0, "{err}");
    println!("spanprof's peak RSS: {} MiB", peak >> 20);
    assert!(peak < 256 << 20, "peak RSS {peak} bytes:\n{err}");
    assert!(
        err.contains("3 module or debug files refused as unsafe or too large to read")
            && err.contains("hostile_tib: section .debug_info claims 1099511627776 bytes")
            && err.contains("hostile_bomb: section .debug_info inflates past the 4194304 bytes")
            && err.contains("hostile_link: 1 debug-link candidate(s) larger than 256 MiB not read"),
        "{err}"
    );
    let stacks = parse_folded(&std::fs::read_to_string(&folded).unwrap()).unwrap();
    let of = |name: &str| -> Vec<_> {
        stacks
            .iter()
            .filter(|s| s.frames[0].ends_with(&format!("({name})]")))
            .collect()
    };
    // The co-target's stacks are whole: its own function named under main.
    let co = of("cotarget");
    let co_all: u64 = co.iter().map(|s| s.count).sum();
    let co_named: u64 = co
        .iter()
        .filter(|s| s.contains_seq(&["main", "burn"]))
        .map(|s| s.count)
        .sum();
    assert!(
        co_all >= 50 && co_named * 100 >= co_all * 95,
        "cotarget: {co_named} of {co_all} samples in main;burn\n{err}"
    );
    // The hostile ones are sampled, their frames unnamed, never another module's name.
    for name in ["hostile_tib", "hostile_bomb"] {
        let own = of(name);
        assert!(
            own.iter().map(|s| s.count).sum::<u64>() >= 50,
            "{name}: {err}"
        );
        for s in own {
            for f in &s.frames[1..] {
                assert!(
                    !f.contains("burn") && (!f.contains(name) || f.starts_with("[unknown]")),
                    "{name}: frame {f}"
                );
            }
        }
    }
    assert!(Path::new(&folded).is_file());
}

/// A container's (here a chroot's) debug file path that is a symbolic link to a host file:
/// the link resolves inside the container's root, so the host's debug file of the very same
/// build is not used (the stripped program's frames stay unnamed), while a link to the
/// container's own copy is followed (they are named).
#[test]
fn a_container_s_debug_link_to_a_host_file_is_resolved_in_its_root() {
    require_root();
    let tmp = TempDir::new("debug-link-escape");
    let src = tmp.join("burn.c");
    std::fs::write(&src, SOURCE).unwrap();
    let full = tmp.join("full");
    let run = |cmd: &mut std::process::Command| {
        let out = cmd.output().expect("run a build tool");
        assert!(out.status.success(), "{cmd:?}: {out:?}");
    };
    run(std::process::Command::new("cc")
        .args(["-static", "-O1", "-g", "-o"])
        .arg(&full)
        .arg(&src));
    let debug = tmp.join("full.debug");
    run(std::process::Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(&debug));
    let stripped = tmp.join("stripped");
    run(std::process::Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(&full));
    // Its build id, from the note (readelf, not spanprof).
    let notes = std::process::Command::new("readelf")
        .arg("-n")
        .arg(&stripped)
        .output()
        .unwrap();
    let notes = String::from_utf8_lossy(&notes.stdout);
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("a build id")
        .to_string();
    let debug_path = format!("usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]);
    let root_with = |name: &str, target: &Path| {
        let root = tmp.join(name);
        let link = root.join(&debug_path);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::fs::copy(&stripped, root.join("burn")).unwrap();
        std::os::unix::fs::symlink(target, &link).unwrap();
        root
    };
    // To the host's file, by its absolute host path; to the root's own copy, by `/own.debug`.
    let escaping = root_with("escaping", &debug);
    let own = root_with("own", Path::new("/own.debug"));
    std::fs::copy(&debug, own.join("own.debug")).unwrap();
    let named = |root: &Path| -> (u64, u64) {
        let folded = root.with_extension("folded");
        let _lock = profiling_lock();
        let run = || {
            spanprof_tests::run_spanprof(spanprof_tests::args![
                "profile",
                "-F",
                "499",
                "-o",
                &folded,
                "--",
                "chroot",
                root,
                "/burn",
                "300000000"
            ])
        };
        // NB: ETXTBSY while another test thread's fork still holds the fresh copy (see above).
        let mut out = run();
        for _ in 0..20 {
            if !out.stderr.contains("Text file busy") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            out = run();
        }
        out.assert_success();
        let stacks = parse_folded(&std::fs::read_to_string(&folded).unwrap()).unwrap();
        let all = stacks.iter().map(|s| s.count).sum();
        let burn = stacks
            .iter()
            .filter(|s| s.frames.iter().any(|f| f == "burn"))
            .map(|s| s.count)
            .sum();
        (burn, all)
    };
    let (burn, all) = named(&escaping);
    assert!(all >= 50, "{all} samples");
    assert_eq!(
        burn, 0,
        "the host's debug file named {burn} of {all} samples"
    );
    let (burn, all) = named(&own);
    assert!(
        burn * 100 >= all * 90,
        "the root's own debug file named {burn} of {all} samples"
    );
}
