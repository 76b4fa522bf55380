//! `cargo xtask bench --quick --scenario p6` against a fresh local control plane: exits 0,
//! prints the P6 table and writes a report whose P6 rows hold both controllers' write counts,
//! each at least the job's minimum, and the same tables as `benchmarks.md` (timings are not
//! asserted: the machine is shared).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Room for building the control plane on a machine that never did (~10 min on 2 cores).
const DEADLINE: Duration = Duration::from_secs(30 * 60);
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
fn bench_quick_p6_reports_writes_of_both_controllers() {
    let out = tempfile::tempdir().unwrap();
    let mut cmd = if Path::new("/usr/bin/setpriv").is_file() {
        let mut c = Command::new("/usr/bin/setpriv");
        c.args(["--pdeathsig", "KILL", "--", env!("CARGO_BIN_EXE_xtask")]);
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_xtask"))
    };
    cmd.args(["bench", "--quick", "--scenario", "p6"])
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
    let minimum = row_cells(&html, "p6-minimum");
    assert_eq!(
        minimum[1..3],
        [(TENANTS * 13).to_string(), (TENANTS * 13).to_string()]
    );
    let writes = row_cells(&html, "p6-writes");
    for (side, cell) in ["idem", "peer"].iter().zip(&writes[1..3]) {
        let n: u64 = cell
            .parse()
            .unwrap_or_else(|_| panic!("{side} writes {cell:?}"));
        assert!(
            n >= TENANTS * 13,
            "{side} made {n} writes, fewer than the job needs"
        );
    }
    let ratio = row_cells(&html, "p6-ratio");
    assert!(
        ratio[3].parse::<f64>().is_ok(),
        "idem ÷ peer {:?}",
        ratio[3]
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
        md.contains("- command: `cargo xtask bench --quick --scenario p6"),
        "{md}"
    );
    assert!(!md.contains("## P4"), "only P6 was selected:\n{md}");
}
