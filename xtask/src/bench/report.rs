//! The bench's figures as tables of every controller, idem ÷ the best peer and which peer
//! that is, one per scenario, with the target beside each row.

use std::time::Duration;

use super::child::Side;
use super::counts::{Counts, VERBS};
use super::scenarios::{Plan, SideResult, WRITES_PER_TENANT, median_ms};

/// One row: a figure for every controller.
#[derive(Clone, Debug)]
pub struct Row {
    /// Stable id (`p6-ratio`), used in the HTML report.
    pub id: String,
    /// What it is.
    pub label: String,
    /// Each controller's figure, in the table's [`Table::sides`] order (idem first).
    pub values: Vec<String>,
    /// idem ÷ the best peer.
    pub ratio: String,
    /// The best peer's title: every figure is better lower, so the peer with the smallest
    /// (the first of a tie).
    pub best: String,
    /// The target, in words.
    pub target: String,
}

/// One scenario's table.
#[derive(Clone, Debug)]
pub struct Table {
    /// `P2`, …
    pub id: String,
    /// Title line.
    pub title: String,
    /// The controllers of the columns, idem first.
    pub sides: Vec<Side>,
    /// Rows.
    pub rows: Vec<Row>,
}

impl Table {
    fn new(id: &str, title: String, sides: &[Side]) -> Self {
        Self {
            id: id.to_owned(),
            title,
            sides: sides.to_vec(),
            rows: Vec::new(),
        }
    }

    /// A row of `values`, one per side (idem first); idem ÷ the smallest of the peers'.
    fn row(
        &mut self,
        id: &str,
        label: impl Into<String>,
        values: &[f64],
        digits: usize,
        target: &str,
    ) {
        let idem = values.first().copied().unwrap_or(0.0);
        let best =
            values
                .iter()
                .enumerate()
                .skip(1)
                .fold(None, |best: Option<(usize, f64)>, (i, v)| match best {
                    Some((_, b)) if b <= *v => best,
                    _ => Some((i, *v)),
                });
        let (ratio, best) = match best {
            Some((i, v)) => (ratio(idem, v), self.sides[i].title().to_owned()),
            None => ("–".to_owned(), "–".to_owned()),
        };
        self.rows.push(Row {
            id: id.to_owned(),
            label: label.into(),
            values: values.iter().map(|v| format!("{v:.digits$}")).collect(),
            ratio,
            best,
            target: target.to_owned(),
        });
    }

    /// The column headers after the label column.
    pub fn header(&self) -> Vec<String> {
        let mut h: Vec<String> = self.sides.iter().map(|s| s.title().to_owned()).collect();
        h.extend([
            "idem ÷ best peer".into(),
            "best peer".into(),
            "target".into(),
        ]);
        h
    }

    /// A row's cells after the label, as [`Table::header`] orders them.
    pub fn cells<'a>(&self, r: &'a Row) -> Vec<&'a str> {
        let mut c: Vec<&str> = r.values.iter().map(String::as_str).collect();
        c.extend([r.ratio.as_str(), &r.best, &r.target]);
        c
    }

    /// The table as aligned plain text.
    pub fn to_text(&self) -> String {
        let mut header = vec![String::new()];
        header.extend(self.header());
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                let mut c = vec![r.label.clone()];
                c.extend(self.cells(r).into_iter().map(str::to_owned));
                c
            })
            .collect();
        let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for c in &cells {
            for (w, s) in width.iter_mut().zip(c) {
                *w = (*w).max(s.chars().count());
            }
        }
        let line = |c: &[String]| {
            let mut s = String::new();
            for (i, (cell, w)) in c.iter().zip(&width).enumerate() {
                let pad = w - cell.chars().count();
                if i == 0 {
                    s.push_str(&format!("{cell}{} ", " ".repeat(pad)));
                } else {
                    s.push_str(&format!("| {}{cell} ", " ".repeat(pad)));
                }
            }
            s.trim_end().to_owned()
        };
        let mut out = format!("{}: {}\n{}\n", self.id, self.title, line(&header));
        for c in &cells {
            out.push_str(&line(c));
            out.push('\n');
        }
        out
    }

    /// The table as a Markdown section (`## P6: …` and a pipe table).
    pub fn to_markdown(&self) -> String {
        let header = self.header();
        let mut out = format!(
            "## {}: {}\n\n| | {} |\n|---|{}\n",
            self.id,
            self.title,
            header.join(" | "),
            "---|".repeat(header.len())
        );
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {} |\n",
                r.label,
                self.cells(r).join(" | ")
            ));
        }
        out
    }

    /// A one-row table of idem and both peers, for tests of what renders tables.
    #[cfg(test)]
    pub fn example(id: &str, title: &str) -> Self {
        let mut t = Self::new(id, title.to_owned(), &Side::ALL);
        t.row("x", "a figure", &[1.0, 2.0, 4.0], 1, "≤ 1");
        t
    }
}

/// `a ÷ b` with two decimals; `1.00` when both are 0, `∞` when only `b` is.
pub fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 {
        if a == 0.0 {
            "1.00".into()
        } else {
            "∞".into()
        }
    } else {
        format!("{:.2}", a / b)
    }
}

/// The median of `samples` (zero for none).
fn median(samples: &[Duration]) -> Duration {
    let mut v = samples.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

/// Every selected scenario's table, of `results` (idem first, then the peers that ran).
pub fn tables(plan: &Plan, raw: Option<Duration>, results: &[SideResult]) -> Vec<Table> {
    let sides: Vec<Side> = results.iter().map(|r| r.side).collect();
    let all = |f: &dyn Fn(&SideResult) -> f64| -> Vec<f64> { results.iter().map(f).collect() };
    let mut out = Vec::new();
    let n = plan.tenants;
    if plan.has("p2") {
        let mut t = Table::new(
            "P2",
            format!("{n} tenants × 3 namespaces → all Ready"),
            &sides,
        );
        t.row(
            "p2-time",
            "time to all Ready (s)",
            &all(&|r| secs(r.p2.time)),
            2,
            "≤ 0.60",
        );
        t.row(
            "p2-per-tenant",
            "time per tenant (ms)",
            &all(&|r| secs(r.p2.time) * 1000.0 / n as f64),
            1,
            "flat in N",
        );
        t.row(
            "p2-cpu",
            "controller CPU, user + system (s)",
            &all(&|r| secs(r.p2.cpu)),
            2,
            "",
        );
        t.row(
            "p2-cpu-per-tenant",
            "controller CPU per tenant (ms)",
            &all(&|r| secs(r.p2.cpu) * 1000.0 / n as f64),
            2,
            "flat in N",
        );
        t.row(
            "p2-server-cpu",
            "API server + etcd CPU meanwhile (s)",
            &all(&|r| secs(r.p2.server_cpu)),
            2,
            "",
        );
        t.row(
            "p2-server-cpu-per-tenant",
            "API server + etcd CPU per tenant (ms)",
            &all(&|r| secs(r.p2.server_cpu) * 1000.0 / n as f64),
            2,
            "",
        );
        t.row(
            "p2-rss",
            format!("RSS once all Ready ({} objects cached) (MB)", n * 13),
            &all(&|r| mb(r.p2.rss)),
            1,
            "",
        );
        t.row(
            "p2-rss-anon",
            "of which anonymous: heap, stacks (MB)",
            &all(&|r| mb(r.p2.rss_anon)),
            1,
            "",
        );
        t.row(
            "p2-rss-rest",
            format!(
                "RSS {} s after all Ready, nothing new to do (MB)",
                super::scenarios::AT_REST.as_secs()
            ),
            &all(&|r| mb(r.p2.rss_rest)),
            1,
            "",
        );
        t.row(
            "p2-rss-anon-rest",
            "of which anonymous (MB)",
            &all(&|r| mb(r.p2.rss_anon_rest)),
            1,
            "",
        );
        t.row(
            "p2-rss-peak",
            "peak RSS of the process until then (VmHWM) (MB)",
            &all(&|r| mb(r.p2.rss_peak)),
            1,
            "",
        );
        if let Some(raw) = raw {
            t.row(
                "p2-raw",
                format!(
                    "time ÷ raw-client limit ({} creates in {:.2} s)",
                    n as u64 * WRITES_PER_TENANT,
                    secs(raw)
                ),
                &all(&|r| secs(r.p2.time) / secs(raw)),
                2,
                "idem ≤ 2.0",
            );
        }
        t.row(
            "p2-reconciles",
            "reconciles per tenant",
            &all(&|r| r.p2.reconciles_per_tenant),
            2,
            "idem ≤ 1.2",
        );
        t.row(
            "p2-requests",
            "requests, all verbs",
            &all(&|r| r.p2.counts.total() as f64),
            0,
            "",
        );
        t.row(
            "p2-writes",
            "write requests",
            &all(&|r| r.p2.counts.writes() as f64),
            0,
            "",
        );
        t.row(
            "p2-latency",
            "create → Ready, median (ms)",
            &all(&|r| median_ms(&r.p2.ready_latencies) as f64),
            0,
            "",
        );
        out.push(t);
    }
    let restarts: Option<Vec<&Counts>> = results.iter().map(|r| r.restart.as_ref()).collect();
    let resyncs: Option<Vec<&Counts>> = results.iter().map(|r| r.resync.as_ref()).collect();
    if let (Some(restarts), Some(resyncs)) = (restarts, resyncs) {
        let mut t = Table::new(
            "P3",
            format!(
                "requests after a restart of the converged fleet and during a full resync ({} s period)",
                plan.resync_secs
            ),
            &sides,
        );
        verb_rows(&mut t, "p3-restart", "after restart", &restarts);
        verb_rows(&mut t, "p3-resync", "full resync", &resyncs);
        out.push(t);
    }
    let p4s: Option<Vec<&super::scenarios::P4>> = results.iter().map(|r| r.p4.as_ref()).collect();
    if let Some(p4s) = p4s {
        let mut t = Table::new(
            "P4",
            format!(
                "a quiet tenant's change alone vs right after another tenant's {}-object flood ({} floods)",
                plan.flood, plan.floods
            ),
            &sides,
        );
        let alone = |v: &[Duration]| median_ms(v) as f64;
        let each = |f: &dyn Fn(&super::scenarios::P4) -> f64| -> Vec<f64> {
            p4s.iter().map(|p| f(p)).collect()
        };
        t.row(
            "p4-alone",
            "quiet change alone, median (ms)",
            &each(&|p| alone(&p.alone)),
            0,
            "",
        );
        t.row(
            "p4-flooded",
            "quiet change right after a flood, median (ms)",
            &each(&|p| median_ms(&p.after) as f64),
            0,
            "",
        );
        t.row(
            "p4-during",
            "quiet changes until a flood drained, median (ms)",
            &each(&|p| median_ms(&p.flooded) as f64),
            0,
            "",
        );
        t.row(
            "p4-ratio",
            "after flood ÷ alone",
            &each(&|p| median_ms(&p.after) as f64 / alone(&p.alone).max(1.0)),
            2,
            "idem ≤ 3",
        );
        t.row(
            "p4-drain",
            "flood drained, median (s)",
            &each(&|p| secs(median(&p.drains))),
            2,
            "≤ 1.00",
        );
        out.push(t);
    }
    let p5s: Option<Vec<(u64, usize)>> = results.iter().map(|r| r.p5).collect();
    if let Some(p5s) = p5s {
        let objects = p5s.first().map_or(0, |p| p.1);
        let mut t = Table::new(
            "P5",
            "resident memory of the controller process (VmRSS)".into(),
            &sides,
        );
        t.row(
            "p5-rss",
            format!("RSS at the end ({objects} objects cached) (MB)"),
            &p5s.iter().map(|p| mb(p.0)).collect::<Vec<_>>(),
            1,
            "≤ 1.00",
        );
        out.push(t);
    }
    if plan.has("p6") {
        let mut t = Table::new(
            "P6",
            format!("writes to make {n} tenants Ready vs the minimum"),
            &sides,
        );
        let min = n as f64 * WRITES_PER_TENANT as f64;
        let writes = all(&|r| r.p2.counts.writes() as f64);
        t.row("p6-writes", "write requests in P2", &writes, 0, "");
        t.row(
            "p6-minimum",
            format!("minimum ({n} × {WRITES_PER_TENANT})"),
            &vec![min; sides.len()],
            0,
            "",
        );
        t.row(
            "p6-ratio",
            "writes ÷ minimum",
            &writes.iter().map(|w| w / min).collect::<Vec<_>>(),
            2,
            "idem = 1.00",
        );
        out.push(t);
    }
    out
}

fn verb_rows(t: &mut Table, id: &str, what: &str, counts: &[&Counts]) {
    for verb in VERBS {
        let values: Vec<f64> = counts.iter().map(|c| c.get(verb) as f64).collect();
        if values.iter().sum::<f64>() > 0.0 {
            t.row(
                &format!("{id}-{verb}"),
                format!("{what}: {verb}"),
                &values,
                0,
                "idem 0",
            );
        }
    }
    t.row(
        &format!("{id}-total"),
        format!("{what}: all verbs"),
        &counts.iter().map(|c| c.total() as f64).collect::<Vec<_>>(),
        0,
        "idem 0",
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_handle_zero() {
        assert_eq!(ratio(1.0, 2.0), "0.50");
        assert_eq!(ratio(0.0, 0.0), "1.00");
        assert_eq!(ratio(3.0, 0.0), "∞");
    }

    #[test]
    fn text_tables_align_columns() {
        let mut t = Table::new("P6", "writes".into(), &Side::ALL);
        t.row(
            "p6-ratio",
            "writes ÷ minimum",
            &[1.0, 2.5, 2.0],
            2,
            "idem = 1.00",
        );
        let text = t.to_text();
        assert!(text.starts_with("P6: writes\n"), "{text}");
        assert!(
            text.contains("| idem | kube-runtime | controller-runtime | idem ÷ best peer |"),
            "{text}"
        );
        assert!(
            text.contains(
                "writes ÷ minimum | 1.00 |         2.50 |               2.00 |             0.50 | controller-runtime | idem = 1.00"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_best_peer_is_the_smaller_figure_and_the_first_of_a_tie() {
        let mut t = Table::new("P2", "time".into(), &Side::ALL);
        t.row("a", "a", &[3.0, 2.0, 6.0], 0, "");
        t.row("b", "b", &[3.0, 6.0, 6.0], 0, "");
        t.row("c", "c", &[3.0, 6.0, 1.5], 1, "");
        let best: Vec<(&str, &str)> = t
            .rows
            .iter()
            .map(|r| (r.ratio.as_str(), r.best.as_str()))
            .collect();
        assert_eq!(
            best,
            [
                ("1.50", "kube-runtime"),
                ("0.50", "kube-runtime"),
                ("2.00", "controller-runtime")
            ]
        );
        let one = Table::new("P2", "time".into(), &[Side::Idem, Side::ControllerRuntime]);
        assert_eq!(one.header()[1], "controller-runtime");
    }
}
