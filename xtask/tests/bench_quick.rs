//! `cargo xtask bench --quick --debug --scenario p6` against a fresh local control plane: exits 0,
//! prints the P6 table and writes a report whose P6 rows hold the write counts of idem and
//! both peers (kube-runtime, controller-runtime), each at least the job's minimum, idem ÷ the
//! best peer and which peer that is, and the same tables as `benchmarks.md` (timings are not
//! asserted: the machine is shared).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Room for building the control plane and the controller-runtime peer on a machine that
/// never did (~10 min and ~5 min on 2 cores). The Rust controllers are built with `--debug`:
/// the workspace's test build already holds their dependencies, while a cold release build
/// of them took 27 min on a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_secs(40 * 60);
/// The columns of a P6 row after its label.
const SIDES: [&str; 3] = ["idem", "kube-runtime", "controller-runtime"];
const TENANTS: u64 = 10;

/// The numbers in the `<td>` cells of the report row with id `id`.
fn row_cells(html: &str, id: &str) -> Vec<String> {
    let start = html
        .find(&format!("<tr id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no row {id} in the report:\n{html}"));
    let row = &html[start..];
    let row = &row[..row.find("</tr>").expect("a closed row")];
    row.split("<td>")
        .skip(1)
        .map(|c| c.split("</td>").next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn bench_quick_p6_reports_writes_of_all_three_controllers() {
    let out = tempfile::tempdir().unwrap();
    let mut cmd = if Path::new("/usr/bin/setpriv").is_file() {
        let mut c = Command::new("/usr/bin/setpriv");
        c.args(["--pdeathsig", "KILL", "--", env!("CARGO_BIN_EXE_xtask")]);
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_xtask"))
    };
    cmd.args(["bench", "--quick", "--debug", "--scenario", "p6"])
        .arg(format!("--tenants={TENANTS}"))
        .arg("--out")
        .arg(out.path())
        .env("CARGO", env!("CARGO"))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0);
    let mut child = cmd.spawn().expect("starting cargo xtask bench");
    let started = Instant::now();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("`bench --quick` did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let printed = reader.join().unwrap();
    assert!(
        status.success(),
        "`bench` failed ({status}); stdout:\n{printed}"
    );
    assert!(
        printed.contains("P6: writes to make 10 tenants Ready"),
        "{printed}"
    );
    assert!(!printed.contains("P4:"), "only P6 was selected:\n{printed}");

    let html = std::fs::read_to_string(out.path().join("report.html")).expect("report.html");
    let header = html
        .find("<h2 id=\"p6\">")
        .map(|i| &html[i..])
        .unwrap_or_default();
    assert!(
        header.contains(
            "<th>idem</th><th>kube-runtime</th><th>controller-runtime</th><th>idem ÷ best peer</th><th>best peer</th>"
        ),
        "P6 columns:\n{html}"
    );
    let minimum = row_cells(&html, "p6-minimum");
    assert_eq!(minimum[1..4], vec![(TENANTS * 13).to_string(); 3]);
    let writes = row_cells(&html, "p6-writes");
    let mut counts = Vec::new();
    for (side, cell) in SIDES.iter().zip(&writes[1..4]) {
        let n: u64 = cell
            .parse()
            .unwrap_or_else(|_| panic!("{side} writes {cell:?}"));
        assert!(
            n >= TENANTS * 13,
            "{side} made {n} writes, fewer than the job needs"
        );
        counts.push(n);
    }
    eprintln!("P6 writes: {SIDES:?} = {counts:?}");
    // idem ÷ the peer with fewer writes, and that peer named.
    let best = if counts[1] <= counts[2] { 1 } else { 2 };
    let ratio: f64 = writes[4]
        .parse()
        .unwrap_or_else(|_| panic!("idem ÷ best peer {:?}", writes[4]));
    let expected = counts[0] as f64 / counts[best] as f64;
    assert!((ratio - expected).abs() < 0.006, "{ratio} ≠ {expected}");
    assert_eq!(writes[5], SIDES[best], "best peer of {counts:?}");
    let ratio = row_cells(&html, "p6-ratio");
    assert!(
        ratio[4].parse::<f64>().is_ok(),
        "idem ÷ best peer {:?}",
        ratio[4]
    );
    assert!(html.contains("requests by verb"), "no request plot");

    // The Markdown page of the run (what `--record` copies to docs/benchmarks.md), naming the
    // command it came from; without `--record` the repository's copy is not touched.
    let md = std::fs::read_to_string(out.path().join("benchmarks.md")).expect("benchmarks.md");
    assert!(
        md.contains("## P6: writes to make 10 tenants Ready"),
        "{md}"
    );
    assert!(
        md.contains("- command: `cargo xtask bench --quick --debug --scenario p6"),
        "{md}"
    );
    assert!(!md.contains("## P4"), "only P6 was selected:\n{md}");
    assert!(
        md.contains(
            "| | idem | kube-runtime | controller-runtime | idem ÷ best peer | best peer |"
        ),
        "{md}"
    );
    assert!(md.contains("Rust controllers in debug builds"), "{md}");
}
