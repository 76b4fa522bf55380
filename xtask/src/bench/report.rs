//! The bench's figures as tables of idem, peer and idem ÷ peer, one per scenario, with the
//! issue's target beside each row.

use std::time::Duration;

use super::counts::{Counts, VERBS};
use super::scenarios::{Plan, SideResult, WRITES_PER_TENANT, median_ms};

/// One row: a figure for both controllers.
#[derive(Clone, Debug)]
pub struct Row {
    /// Stable id (`p6-ratio`), used in the HTML report.
    pub id: String,
    /// What it is.
    pub label: String,
    /// idem's figure.
    pub idem: String,
    /// The peer's figure.
    pub peer: String,
    /// idem ÷ peer.
    pub ratio: String,
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
    /// Rows.
    pub rows: Vec<Row>,
}

impl Table {
    fn new(id: &str, title: String) -> Self {
        Self {
            id: id.to_owned(),
            title,
            rows: Vec::new(),
        }
    }

    fn row(
        &mut self,
        id: &str,
        label: impl Into<String>,
        idem: f64,
        peer: f64,
        digits: usize,
        target: &str,
    ) {
        self.rows.push(Row {
            id: id.to_owned(),
            label: label.into(),
            idem: format!("{idem:.digits$}"),
            peer: format!("{peer:.digits$}"),
            ratio: ratio(idem, peer),
            target: target.to_owned(),
        });
    }

    /// The table as aligned plain text.
    pub fn to_text(&self) -> String {
        let header = ["", "idem", "peer", "idem ÷ peer", "target"];
        let cells: Vec<[&str; 5]> = self
            .rows
            .iter()
            .map(|r| [r.label.as_str(), &r.idem, &r.peer, &r.ratio, &r.target])
            .collect();
        let mut width = header.map(|h| h.chars().count());
        for c in &cells {
            for (w, s) in width.iter_mut().zip(c) {
                *w = (*w).max(s.chars().count());
            }
        }
        let line = |c: &[&str; 5]| {
            let mut s = String::new();
            for (i, (cell, w)) in c.iter().zip(width).enumerate() {
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
        let mut out = format!(
            "## {}: {}\n\n| | idem | peer | idem ÷ peer | target |\n|---|---|---|---|---|\n",
            self.id, self.title
        );
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                r.label, r.idem, r.peer, r.ratio, r.target
            ));
        }
        out
    }

    /// A one-row table, for tests of what renders tables.
    #[cfg(test)]
    pub fn example(id: &str, title: &str) -> Self {
        let mut t = Self::new(id, title.to_owned());
        t.row("x", "a figure", 1.0, 2.0, 1, "≤ 1");
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

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

/// Every selected scenario's table.
pub fn tables(
    plan: &Plan,
    raw: Option<Duration>,
    idem: &SideResult,
    peer: &SideResult,
) -> Vec<Table> {
    let mut out = Vec::new();
    let n = plan.tenants;
    if plan.has("p2") {
        let mut t = Table::new("P2", format!("{n} tenants × 3 namespaces → all Ready"));
        let (a, b) = (&idem.p2, &peer.p2);
        t.row(
            "p2-time",
            "time to all Ready (s)",
            secs(a.time),
            secs(b.time),
            2,
            "≤ 0.80",
        );
        let per_tenant = |d: Duration| secs(d) * 1000.0 / n as f64;
        t.row(
            "p2-per-tenant",
            "time per tenant (ms)",
            per_tenant(a.time),
            per_tenant(b.time),
            1,
            "flat in N",
        );
        if let Some(raw) = raw {
            t.row(
                "p2-raw",
                format!(
                    "time ÷ raw-client limit ({} creates in {:.2} s)",
                    n as u64 * WRITES_PER_TENANT,
                    secs(raw)
                ),
                secs(a.time) / secs(raw),
                secs(b.time) / secs(raw),
                2,
                "idem ≤ 2.0",
            );
        }
        t.row(
            "p2-reconciles",
            "reconciles per tenant",
            a.reconciles_per_tenant,
            b.reconciles_per_tenant,
            2,
            "idem ≤ 1.2",
        );
        t.row(
            "p2-requests",
            "requests, all verbs",
            a.counts.total() as f64,
            b.counts.total() as f64,
            0,
            "",
        );
        t.row(
            "p2-writes",
            "write requests",
            a.counts.writes() as f64,
            b.counts.writes() as f64,
            0,
            "",
        );
        t.row(
            "p2-latency",
            "create → Ready, median (ms)",
            median_ms(&a.ready_latencies) as f64,
            median_ms(&b.ready_latencies) as f64,
            0,
            "",
        );
        out.push(t);
    }
    if let (Some(ra), Some(rb), Some(sa), Some(sb)) =
        (&idem.restart, &peer.restart, &idem.resync, &peer.resync)
    {
        let mut t = Table::new(
            "P3",
            format!(
                "requests after a restart of the converged fleet and during a full resync ({} s period)",
                plan.resync_secs
            ),
        );
        verb_rows(&mut t, "p3-restart", "after restart", ra, rb);
        verb_rows(&mut t, "p3-resync", "full resync", sa, sb);
        out.push(t);
    }
    if let (Some(a), Some(b)) = (&idem.p4, &peer.p4) {
        let mut t = Table::new(
            "P4",
            format!(
                "a quiet tenant's change alone vs right after another tenant's {}-object flood",
                plan.flood
            ),
        );
        let first = |v: &[Duration]| v.first().map_or(0.0, |d| d.as_millis() as f64);
        let alone = |v: &[Duration]| median_ms(v) as f64;
        t.row(
            "p4-alone",
            "quiet change alone, median (ms)",
            alone(&a.alone),
            alone(&b.alone),
            0,
            "",
        );
        t.row(
            "p4-flooded",
            "quiet change right after the flood (ms)",
            first(&a.flooded),
            first(&b.flooded),
            0,
            "",
        );
        let slow = |x: &super::scenarios::P4| first(&x.flooded) / alone(&x.alone).max(1.0);
        t.row(
            "p4-ratio",
            "after flood ÷ alone",
            slow(a),
            slow(b),
            2,
            "idem ≤ 3",
        );
        t.row(
            "p4-drain",
            "flood drained (s)",
            secs(a.drain),
            secs(b.drain),
            2,
            "≤ 1.00",
        );
        out.push(t);
    }
    if let (Some((ra, objects)), Some((rb, _))) = (idem.p5, peer.p5) {
        let mut t = Table::new(
            "P5",
            "resident memory of the controller process (VmRSS)".into(),
        );
        t.row(
            "p5-rss-p2",
            format!("RSS with the P2 fleet cached ({} objects) (MB)", n * 13),
            mb(idem.p2.rss),
            mb(peer.p2.rss),
            1,
            "",
        );
        t.row(
            "p5-rss",
            format!("RSS at the end ({objects} objects cached) (MB)"),
            mb(ra),
            mb(rb),
            1,
            "≤ 1.00",
        );
        out.push(t);
    }
    if plan.has("p6") {
        let mut t = Table::new(
            "P6",
            format!("writes to make {n} tenants Ready vs the minimum"),
        );
        let min = n as f64 * WRITES_PER_TENANT as f64;
        let (wa, wb) = (
            idem.p2.counts.writes() as f64,
            peer.p2.counts.writes() as f64,
        );
        t.row("p6-writes", "write requests in P2", wa, wb, 0, "");
        t.row(
            "p6-minimum",
            format!("minimum ({n} × {WRITES_PER_TENANT})"),
            min,
            min,
            0,
            "",
        );
        t.row(
            "p6-ratio",
            "writes ÷ minimum",
            wa / min,
            wb / min,
            2,
            "idem = 1.00",
        );
        out.push(t);
    }
    out
}

fn verb_rows(t: &mut Table, id: &str, what: &str, a: &Counts, b: &Counts) {
    for verb in VERBS {
        let (x, y) = (a.get(verb), b.get(verb));
        if x + y > 0 {
            t.row(
                &format!("{id}-{verb}"),
                format!("{what}: {verb}"),
                x as f64,
                y as f64,
                0,
                "idem 0",
            );
        }
    }
    t.row(
        &format!("{id}-total"),
        format!("{what}: all verbs"),
        a.total() as f64,
        b.total() as f64,
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
        let mut t = Table::new("P6", "writes".into());
        t.row("p6-ratio", "writes ÷ minimum", 1.0, 2.5, 2, "idem = 1.00");
        let text = t.to_text();
        assert!(text.starts_with("P6: writes\n"), "{text}");
        assert!(
            text.contains("writes ÷ minimum | 1.00 | 2.50 |        0.40 | idem = 1.00"),
            "{text}"
        );
    }
}
