use super::*;

#[inline(never)]
fn marker_function_for_symbolizer_test() -> u64 {
    std::hint::black_box(42)
}

#[test]
fn symbolizes_own_function_with_source_line() {
    let addr = marker_function_for_symbolizer_test as *const () as u64;
    let pid = std::process::id();
    let mut s = Symbolizer::new();
    let mut addrs = vec![addr, addr];
    s.normalize(pid, &mut addrs);
    assert_eq!(addrs.len(), 1, "deduplicated");
    assert!(s.user.contains_key(&(pid, addr)));
    let (user, kernel) = s.symbolize(&[(pid, addr)], &[]);
    assert!(kernel.is_empty());
    let sym = &user[0];
    assert!(
        sym.function
            .as_deref()
            .unwrap_or_default()
            .ends_with("marker_function_for_symbolizer_test"),
        "{sym:?}"
    );
    assert!(
        sym.module
            .as_deref()
            .unwrap_or_default()
            .contains("symbolizer"),
        "{sym:?}"
    );
    assert!(
        sym.file
            .as_deref()
            .unwrap_or_default()
            .ends_with("src/tests.rs"),
        "{sym:?}"
    );
    assert!(sym.line.is_some(), "{sym:?}");
}

#[test]
fn gone_process_gives_unknown_with_reason() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let mut s = Symbolizer::new();
    s.normalize(pid, &mut vec![0x401000]);
    let (user, _) = s.symbolize(&[(pid, 0x401000), (pid, 0x5000)], &[]);
    assert_eq!(
        user[0].unknown_reason.as_deref(),
        Some("process exited before symbolization")
    );
    assert_eq!(user[1].unknown_reason.as_deref(), Some("not normalized"));
    assert_eq!(s.stats().process_gone, 1);
}

/// A child's executable mapping of its program (`sleep`): (start, end, path).
fn program_mapping(pid: u32) -> (u64, u64, String) {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let maps = mapped::read_maps(pid).unwrap();
    let m = maps
        .iter()
        .find(|m| m.is_exec() && Path::new(m.file_path()) == exe)
        .expect("the program is mapped executable");
    (m.start, m.end, m.file_path().to_string())
}

#[test]
fn an_exited_process_is_normalized_from_the_map_read_while_it_lived() {
    let mut child = crate::test_child::sleeping();
    let pid = child.id();
    let (start, end, path) = program_mapping(pid);
    let mut s = Symbolizer::new();
    s.normalize(pid, &mut vec![start + 0x10]);
    child.kill().unwrap();
    child.wait().unwrap();
    // An address first seen after the exit, in the same module.
    let late = end - 0x20;
    s.normalize(pid, &mut vec![late]);
    assert_eq!(s.stats().process_gone, 0);
    assert_eq!(s.stats().normalized, 2);
    let (user, _) = s.symbolize(&[(pid, start + 0x10), (pid, late)], &[]);
    for sym in &user {
        assert_eq!(sym.module.as_deref(), Some(path.as_str()), "{sym:?}");
    }
    assert_eq!(user[1].address - user[0].address, late - start - 0x10);
    // Outside every module of the map kept, in a later drain: the map is read again, the
    // process is gone, unknown with the reason.
    s.next_drain();
    s.normalize(pid, &mut vec![0x10]);
    assert_eq!(s.stats().process_gone, 1);
    // Forgotten at the second call after its exit, with its module files.
    assert_eq!(s.cache_stats().processes, 1);
    s.forget_exited();
    assert_eq!(
        s.cache_stats().processes,
        1,
        "kept for samples on their way"
    );
    assert!(s.cache_stats().modules >= 1);
    assert_eq!(s.cache_stats().parsed_peak, s.cache_stats().parsed_bytes);
    let slots = s.modules.len();
    // What the symbolization held is still told once it was dropped, until the next call.
    let held = s.cache_stats().parsed_bytes;
    assert!(held > 0);
    s.forget_exited();
    let stats = s.cache_stats();
    assert_eq!((stats.processes, stats.modules), (0, 0), "{stats:?}");
    assert_eq!(stats.parsed_bytes, 0);
    assert_eq!(stats.parsed_peak, 0, "measured again from the last call");
    assert!(s.user.is_empty());
    // Their slots are reused.
    let own = marker_function_for_symbolizer_test as *const () as u64;
    s.normalize(std::process::id(), &mut vec![own]);
    assert_eq!(s.modules.len(), slots.max(s.cache_stats().modules));
}

#[test]
fn an_exit_told_forgets_the_process_after_the_symbolization_that_holds_its_samples() {
    let pid = std::process::id();
    let addr = marker_function_for_symbolizer_test as *const () as u64;
    let mut s = Symbolizer::new();
    s.normalize(pid, &mut vec![addr]);
    let modules = s.cache_stats().modules;
    // Told of its exit while a window's samples are still to be symbolized: its map goes
    // at once, its addresses stay for that window.
    s.exited(pid);
    assert!(s.procs[&pid].ranges.is_empty());
    s.forget_exited();
    assert!(
        s.user.contains_key(&(pid, addr)),
        "kept for the next symbolization"
    );
    assert_eq!(
        s.cache_stats().modules,
        1,
        "only the module an address refers to"
    );
    assert!(modules >= 1);
    let (user, _) = s.symbolize(&[(pid, addr)], &[]);
    assert!(user[0].function.is_some(), "{:?}", user[0]);
    s.forget_exited();
    let stats = s.cache_stats();
    assert_eq!((stats.processes, stats.modules), (0, 0), "{stats:?}");
    assert!(s.user.is_empty());
}

#[test]
fn parsed_symbols_are_kept_within_the_bound() {
    let addr = marker_function_for_symbolizer_test as *const () as u64;
    let pid = std::process::id();
    let mut s = Symbolizer::new();
    // NB: a debug build of this test binary carries far more DWARF than the default bound.
    s.set_cache_limit(4 << 30);
    s.normalize(pid, &mut vec![addr]);
    let named = |s: &mut Symbolizer| {
        let (user, _) = s.symbolize(&[(pid, addr)], &[]);
        user[0]
            .function
            .as_deref()
            .is_some_and(|f| f.ends_with("marker_function_for_symbolizer_test"))
    };
    assert!(named(&mut s));
    let stats = s.cache_stats();
    assert_eq!(stats.parsed_modules, 1, "{stats:?}");
    assert!(stats.parsed_bytes > 16 << 10, "{stats:?}");
    assert!(stats.parsed_bytes <= stats.limit);
    // A bound below it drops it; symbolizing again parses it again, and drops it after.
    s.set_cache_limit(1);
    assert_eq!(s.cache_stats().parsed_modules, 0);
    assert_eq!(s.cache_stats().parsed_bytes, 0);
    assert!(named(&mut s));
    assert_eq!(s.cache_stats().parsed_bytes, 0);
    // A live process's modules stay open whatever the bound.
    let open = s.cache_stats().modules;
    assert!(open >= 1);
    s.forget_exited();
    s.forget_exited();
    assert_eq!(s.cache_stats().modules, open);
}

/// A fresh anonymous executable page of this process; the caller unmaps it.
fn anonymous_exec_page() -> *mut libc::c_void {
    // SAFETY: a fresh anonymous mapping, which nothing else refers to.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(page, libc::MAP_FAILED);
    page
}

#[test]
fn a_memory_map_is_read_again_only_when_stale_or_short_of_an_address() {
    let pid = std::process::id();
    let own = marker_function_for_symbolizer_test as *const () as u64;
    let mut s = Symbolizer::new();
    s.normalize(pid, &mut vec![own]);
    assert_eq!(s.stats().maps_read, 1);
    // Within the map kept: no read, in this drain or the next.
    s.normalize(pid, &mut vec![own + 1]);
    s.next_drain();
    s.next_drain();
    s.normalize(pid, &mut vec![own + 2]);
    assert_eq!(s.stats().maps_read, 1);
    // An exec makes it stale.
    s.exec(pid);
    s.normalize(pid, &mut vec![own + 3]);
    assert_eq!(s.stats().maps_read, 2);
    // So does its age.
    for _ in 0..MAP_REFRESH_DRAINS {
        s.next_drain();
    }
    s.normalize(pid, &mut vec![own + 4]);
    assert_eq!(s.stats().maps_read, 3);
    // Code mapped since: read again, and named from the new map.
    let page = anonymous_exec_page();
    let addr = page as u64 + 16;
    // (Not in the drain that read it last: a map is read at most once per drain.)
    s.next_drain();
    s.normalize(pid, &mut vec![addr]);
    // SAFETY: mapped above, nothing refers to it.
    unsafe { libc::munmap(page, 4096) };
    assert_eq!(s.stats().maps_read, 4);
    // (The offset is not checked: another test's page may sit next to this one, merged.)
    assert!(matches!(
        s.user.get(&(pid, addr)),
        Some(Location::Anonymous { .. })
    ));
    let (user, _) = s.symbolize(&[(pid, own + 4)], &[]);
    assert!(
        user[0]
            .function
            .as_deref()
            .unwrap_or_default()
            .ends_with("marker_function_for_symbolizer_test"),
        "{:?}",
        user[0]
    );
}

#[test]
fn a_sample_in_anonymous_code_known_does_not_read_the_map_again() {
    let pid = std::process::id();
    let page = anonymous_exec_page();
    let addr = page as u64 + 16;
    let mut s = Symbolizer::new();
    // A first sample reads the map; one in code of that map, in a later drain, does not,
    // whether the code is a module's or anonymous (the vDSO, JIT code).
    assert!(s.seen(pid, addr));
    s.next_drain();
    assert!(!s.seen(pid, addr + 8));
    let own = marker_function_for_symbolizer_test as *const () as u64;
    assert!(!s.seen(pid, own));
    assert_eq!(s.stats().maps_read, 1);
    // SAFETY: mapped above, nothing refers to it.
    unsafe { libc::munmap(page, 4096) };
    // An address outside every range read: read again, once per drain.
    s.next_drain();
    assert!(s.seen(pid, 0x10));
    assert!(!s.seen(pid, 0x10));
    assert_eq!(s.stats().maps_read, 2);
}

#[test]
fn code_mapped_after_a_first_sample_is_named_from_the_same_drain() {
    let pid = std::process::id();
    let own = marker_function_for_symbolizer_test as *const () as u64;
    let mut s = Symbolizer::new();
    // A first sample (in the dynamic loader, say) has the map read...
    assert!(s.seen(pid, own));
    // ... before a library is mapped, which later samples of the same drain are in.
    let page = anonymous_exec_page();
    let addr = page as u64 + 16;
    s.normalize(pid, &mut vec![own, addr]);
    // SAFETY: mapped above, nothing refers to it.
    unsafe { libc::munmap(page, 4096) };
    assert_eq!(s.stats().maps_read, 2);
    assert!(matches!(
        s.user.get(&(pid, addr)),
        Some(Location::Anonymous { .. })
    ));
    // At most one read of its own per drain.
    s.normalize(pid, &mut vec![0x10]);
    assert_eq!(s.stats().maps_read, 2);
}

#[test]
fn unmapped_address_is_unknown_not_error() {
    let pid = std::process::id();
    let mut s = Symbolizer::new();
    s.normalize(pid, &mut vec![0x10]);
    let (user, _) = s.symbolize(&[(pid, 0x10)], &[]);
    assert!(user[0].function.is_none());
    assert_eq!(user[0].unknown_reason.as_deref(), Some(OUTSIDE_MAPPINGS));
}

#[test]
fn an_address_in_anonymous_code_is_code_of_no_module() {
    let pid = std::process::id();
    let page = anonymous_exec_page();
    let addr = page as u64 + 16;
    let mut s = Symbolizer::new();
    s.normalize(pid, &mut vec![addr]);
    // SAFETY: mapped above, nothing refers to it.
    unsafe { libc::munmap(page, 4096) };
    let (user, _) = s.symbolize(&[(pid, addr)], &[]);
    assert_eq!(user[0].unknown_reason.as_deref(), Some(ANONYMOUS_CODE));
    // Shown as where it is, not as an address of no mapping.
    assert_eq!(user[0].module.as_deref(), Some(mapped::ANONYMOUS));
    assert_eq!(user[0].address, 16);
}

#[test]
fn kernel_frames_are_named_alike_from_the_boot_s_core_text_and_from_kallsyms() {
    let all = std::fs::read_to_string("/proc/kallsyms").unwrap();
    // Functions of the kernel itself (no module name after them).
    let funcs: Vec<u64> = all
        .lines()
        .filter_map(|l| {
            let mut p = l.split_ascii_whitespace();
            let addr = u64::from_str_radix(p.next()?, 16).ok()?;
            let kind = p.next()?;
            p.next()?;
            (matches!(kind, "T" | "t") && p.next().is_none()).then_some(addr)
        })
        .collect();
    if funcs.first().is_none_or(|&a| a == 0) {
        // Hidden without root; CI runs as root.
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "kallsyms hides addresses"
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("spanprof-ksyms-{}", std::process::id()));
    let text = kernel_text::core_text(&dir).expect("the core text is kept");
    let mut addrs: Vec<u64> = funcs
        .iter()
        .step_by(funcs.len() / 50)
        .map(|a| a + 1)
        .filter(|&a| text.holds(&[a]))
        .collect();
    addrs.dedup();
    assert!(addrs.len() >= 20, "{} addresses", addrs.len());
    let mut cached = Symbolizer::new();
    cached.kernel_text = Some(Some(text));
    let mut live = Symbolizer::new();
    live.kernel_text = Some(None);
    let (_, from_cache) = cached.symbolize(&[], &addrs);
    let (_, from_kallsyms) = live.symbolize(&[], &addrs);
    std::fs::remove_dir_all(&dir).unwrap();
    let names =
        |s: &[Symbol]| -> Vec<Option<String>> { s.iter().map(|s| s.function.clone()).collect() };
    assert_eq!(names(&from_cache), names(&from_kallsyms));
    assert!(
        from_cache.iter().all(|s| s.function.is_some()),
        "{from_cache:?}"
    );
}
