//! `cargo xtask demo`, README's first command, as `cargo xtask test` ran it into `target/demo`
//! (`SPANPROF_DEMO`): the Python service of `examples/demo/service.py`, traced with
//! OpenTelemetry, profiled without a change to its code. What a new user sees must show what
//! sets spanprof apart: the service's own Python functions first, and its spans by name.

use spanprof_tests::{demo_file, parse_py_frame, run_spanprof};

/// The endpoints of the service, as its spans are named.
const ENDPOINTS: [&str; 2] = ["GET /orders", "POST /checkout"];

/// Whether `name` is a Python function of the demo service (`price_cart (service.py:38)`).
fn in_service(name: &str) -> bool {
    parse_py_frame(name).is_some_and(|p| p.file == "service.py")
}

#[test]
fn the_summary_and_report_name_the_service_s_python_functions_and_spans() {
    let summary = std::fs::read_to_string(demo_file("demo-summary.txt")).unwrap();
    let first = summary
        .split_once("top functions (self):\n")
        .and_then(|(_, rest)| rest.lines().next())
        .unwrap_or_else(|| panic!("no top functions in the summary:\n{summary}"));
    let name = first
        .split_whitespace()
        .skip(2)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        in_service(&name),
        "the summary's first function {name:?} is not one of service.py's:\n{summary}"
    );
    let report = std::fs::read_to_string(demo_file("demo-report.txt")).unwrap();
    let rows: Vec<&str> = report
        .lines()
        .skip_while(|l| !l.contains("function"))
        .skip(1)
        .take_while(|l| l.starts_with(' '))
        .collect();
    let row_name = |l: &str| l.split_whitespace().skip(4).collect::<Vec<_>>().join(" ");
    assert!(
        rows.first()
            .is_some_and(|r| row_name(r).ends_with("(service.py)")),
        "the report's first row is not a function of service.py:\n{report}"
    );
    for endpoint in ENDPOINTS {
        assert!(
            report.lines().any(|l| l.trim_end().ends_with(endpoint)),
            "no span {endpoint:?} in the report's spans:\n{report}"
        );
    }
}

#[test]
fn the_flame_graph_has_a_tower_per_endpoint_with_the_service_s_functions() {
    let svg = std::fs::read_to_string(demo_file("demo.svg")).unwrap();
    let titles: Vec<&str> = svg
        .split("<title>")
        .skip(1)
        .filter_map(|t| t.split_once("</title>").map(|(t, _)| t))
        .collect();
    for endpoint in ENDPOINTS {
        let root = format!("[span {endpoint}] (");
        assert!(
            titles.iter().any(|t| t.starts_with(&root)),
            "no {root:?} frame in demo.svg"
        );
    }
    for function in ["price_cart", "list_orders", "write_receipt"] {
        assert!(
            titles
                .iter()
                .filter_map(|t| t.rsplit_once(" (").map(|(name, _)| name))
                .any(|name| parse_py_frame(name).is_some_and(|p| p.qualname == function)),
            "no {function} frame in demo.svg"
        );
    }
    // The pprof file reads back with the same spans.
    let out = run_spanprof([
        std::ffi::OsString::from("report"),
        demo_file("demo.pb.gz").into(),
        "--span".into(),
        "POST /checkout".into(),
        "--top".into(),
        "3".into(),
    ]);
    out.assert_success();
    assert!(out.stdout.contains("price_cart (service.py)"), "{out}");
}
