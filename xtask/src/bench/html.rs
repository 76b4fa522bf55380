//! The HTML report: the tables, and inline SVG plots (latency distributions, reconciles per
//! tenant over time during the flood, requests by verb). No scripts, no external files.

use std::fmt::Write as _;
use std::time::Duration;

use super::child::Side;
use super::counts::{Counts, VERBS};
use super::report::Table;
use super::scenarios::{Plan, SideResult};

const W: f64 = 560.0;
const H: f64 = 260.0;
const PAD: f64 = 48.0;

/// One plotted line: name, colour, points.
type Series<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// A controller's colour in every plot.
fn color(side: Side) -> &'static str {
    match side {
        Side::Idem => "#1f77b4",
        Side::Kube => "#ff7f0e",
        Side::ControllerRuntime => "#2ca02c",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The whole page, of `results` (idem first, then the peers that ran); `build` says how the
/// controllers were built.
pub fn page(
    plan: &Plan,
    tables: &[Table],
    results: &[SideResult],
    build: &str,
    took: Duration,
) -> String {
    let mut h = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>idem bench</title><style>\
         body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;margin:1em 0}\
         td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}\
         svg{margin:0.5em;border:1px solid #eee}</style></head><body>",
    );
    let titles: Vec<&str> = results.iter().map(|r| r.side.title()).collect();
    let _ = write!(
        h,
        "<h1>{}: cargo xtask bench</h1><p>{} tenants × 3 namespaces, flood of {} objects, \
         {} workers each; run took {:.0} s. Ratios are idem ÷ the best peer of this run (every \
         figure is better lower; the best peer is named beside it). {}, shared machine: \
         compare ratios, not absolute times.</p>",
        esc(&titles.join(" vs ")),
        plan.tenants,
        plan.flood,
        plan.workers,
        took.as_secs_f64(),
        esc(build)
    );
    for t in tables {
        let _ = write!(
            h,
            "<h2 id=\"{}\">{}: {}</h2><table><tr><th></th>",
            t.id.to_lowercase(),
            t.id,
            esc(&t.title)
        );
        for c in t.header() {
            let _ = write!(h, "<th>{}</th>", esc(&c));
        }
        h.push_str("</tr>");
        for r in &t.rows {
            let _ = write!(h, "<tr id=\"{}\"><td>{}</td>", r.id, esc(&r.label));
            for c in t.cells(r) {
                let _ = write!(h, "<td>{}</td>", esc(c));
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
    }
    h.push_str("<h2>Plots</h2>");
    let cdf = |v: &[Duration]| -> Vec<(f64, f64)> {
        let n = v.len().max(1) as f64;
        v.iter()
            .enumerate()
            .map(|(i, d)| (d.as_secs_f64() * 1000.0, (i + 1) as f64 / n))
            .collect()
    };
    let series: Vec<Series<'_>> = results
        .iter()
        .map(|r| (r.side.title(), color(r.side), cdf(&r.p2.ready_latencies)))
        .collect();
    h.push_str(&line_chart(
        "P2: create → Ready per tenant (cumulative share)",
        "ms",
        "share",
        &series,
    ));
    let p4s: Option<Vec<(Side, &super::scenarios::P4)>> = results
        .iter()
        .map(|r| r.p4.as_ref().map(|p| (r.side, p)))
        .collect();
    if let Some(p4s) = p4s {
        let ms = |v: &[Duration]| {
            v.iter()
                .map(|d| d.as_secs_f64() * 1000.0)
                .collect::<Vec<_>>()
        };
        let names: Vec<(String, String)> = p4s
            .iter()
            .map(|(side, _)| {
                (
                    format!("{} alone", side.title()),
                    format!("{} flood", side.title()),
                )
            })
            .collect();
        let mut columns: Vec<(&str, &str, Vec<f64>)> = Vec::new();
        for ((side, p4), (alone, flood)) in p4s.iter().zip(&names) {
            columns.push((alone, color(*side), ms(&p4.alone)));
            columns.push((flood, color(*side), ms(&p4.flooded)));
        }
        h.push_str(&strip_chart(
            "P4: quiet tenant change → Ready (ms, log scale)",
            &columns,
        ));
        for (side, p4) in &p4s {
            let colors = ["#2ca02c", "#d62728", "#9467bd"];
            let series: Vec<Series<'_>> = p4
                .timeline
                .iter()
                .zip(colors)
                .map(|((class, pts), c)| {
                    (
                        class.as_str(),
                        c,
                        // Each class's own share, so the quiet tenant's few reconciles show
                        // when they ran beside the flood's thousands.
                        pts.iter()
                            .map(|(t, n)| (*t, *n as f64 / pts.len().max(1) as f64))
                            .collect(),
                    )
                })
                .collect();
            h.push_str(&line_chart(
                &format!(
                    "P4 {}: dispatches per tenant since the flood began",
                    side.title()
                ),
                "s",
                "share done",
                &series,
            ));
        }
    }
    type Phase<'a> = (&'static str, Vec<(Side, &'a Counts)>);
    let mut phases: Vec<Phase<'_>> = vec![(
        "P2",
        results.iter().map(|r| (r.side, &r.p2.counts)).collect(),
    )];
    let restart: Option<Vec<(Side, &Counts)>> = results
        .iter()
        .map(|r| r.restart.as_ref().map(|c| (r.side, c)))
        .collect();
    if let Some(c) = restart {
        phases.push(("P3 restart", c));
    }
    let resync: Option<Vec<(Side, &Counts)>> = results
        .iter()
        .map(|r| r.resync.as_ref().map(|c| (r.side, c)))
        .collect();
    if let Some(c) = resync {
        phases.push(("P3 resync", c));
    }
    for (name, counts) in &phases {
        h.push_str(&bar_chart(&format!("{name}: requests by verb"), counts));
    }
    h.push_str("<h2>Requests by verb and resource</h2>");
    for (name, counts) in &phases {
        let _ = write!(h, "<h3>{name}</h3><table><tr><th></th>");
        for (side, _) in counts {
            let _ = write!(h, "<th>{}</th>", side.title());
        }
        h.push_str("</tr>");
        let keys: std::collections::BTreeSet<&String> =
            counts.iter().flat_map(|(_, c)| c.1.keys()).collect();
        for k in keys {
            let _ = write!(h, "<tr><td>{}</td>", esc(k));
            for (_, c) in counts {
                let _ = write!(h, "<td>{}</td>", c.1.get(k).copied().unwrap_or(0));
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
    }
    h.push_str("</body></html>\n");
    h
}

fn svg_open(title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-size=\"11\">\
         <text x=\"{}\" y=\"16\" text-anchor=\"middle\" font-weight=\"bold\">{}</text>",
        W / 2.0,
        esc(title)
    )
}

fn axes(x_label: &str, y_label: &str, x_max: f64, y_max: f64) -> String {
    let (x0, y0, x1, y1) = (PAD, H - PAD, W - 16.0, 28.0);
    format!(
        "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"#333\"/>\
         <line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\" stroke=\"#333\"/>\
         <text x=\"{x1}\" y=\"{}\" text-anchor=\"end\">{} {}</text>\
         <text x=\"{x0}\" y=\"{}\" text-anchor=\"middle\">0</text>\
         <text x=\"4\" y=\"{}\">{}</text><text x=\"4\" y=\"{}\">{}</text>",
        y0 + 16.0,
        fmt_num(x_max),
        esc(x_label),
        y0 + 16.0,
        y1 + 4.0,
        fmt_num(y_max),
        y1 + 16.0,
        esc(y_label),
    )
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Lines through each series' points, on shared linear axes from 0.
fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series<'_>]) -> String {
    let x_max = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.0))
        .fold(0.0, f64::max)
        .max(1e-9);
    let y_max = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        .max(1e-9);
    let mut s = svg_open(title);
    s.push_str(&axes(x_label, y_label, x_max, y_max));
    let (pw, ph) = (W - PAD - 16.0, H - PAD - 28.0);
    for (i, (name, color, pts)) in series.iter().enumerate() {
        let path: Vec<String> = pts
            .iter()
            .map(|(x, y)| {
                format!(
                    "{:.1},{:.1}",
                    PAD + x / x_max * pw,
                    H - PAD - y / y_max * ph
                )
            })
            .collect();
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\
             <text x=\"{}\" y=\"{}\" fill=\"{color}\">{} ({} points)</text>",
            path.join(" "),
            PAD + 8.0,
            40.0 + 14.0 * i as f64,
            esc(name),
            pts.len()
        );
    }
    s.push_str("</svg>");
    s
}

/// One column of dots per sample set, on a log₁₀ axis.
fn strip_chart(title: &str, columns: &[(&str, &str, Vec<f64>)]) -> String {
    let all = columns.iter().flat_map(|c| c.2.iter().copied());
    let (lo, hi) = all.fold((f64::MAX, 1.0f64), |(lo, hi), v| {
        (lo.min(v.max(1.0)), hi.max(v))
    });
    let (lo, hi) = (
        lo.min(hi).log10().floor(),
        hi.log10().ceil().max(lo.log10().floor() + 1.0),
    );
    let mut s = svg_open(title);
    let ph = H - PAD - 28.0;
    let y = |v: f64| H - PAD - (v.max(1.0).log10() - lo) / (hi - lo) * ph;
    let mut decade = lo;
    while decade <= hi {
        let v = 10f64.powf(decade);
        let _ = write!(
            s,
            "<line x1=\"{PAD}\" x2=\"{0}\" y1=\"{1:.1}\" y2=\"{1:.1}\" stroke=\"#ddd\"/><text x=\"4\" y=\"{1:.1}\">{2}</text>",
            W - 16.0,
            y(v),
            fmt_num(v)
        );
        decade += 1.0;
    }
    let step = (W - PAD - 16.0) / columns.len().max(1) as f64;
    for (i, (name, color, vals)) in columns.iter().enumerate() {
        let cx = PAD + step * (i as f64 + 0.5);
        for (j, v) in vals.iter().enumerate() {
            let jitter = ((j * 7) % 11) as f64 - 5.0;
            let _ = write!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\" fill-opacity=\"0.6\"/>",
                cx + jitter * 2.0,
                y(*v)
            );
        }
        let _ = write!(
            s,
            "<text x=\"{cx:.1}\" y=\"{}\" text-anchor=\"middle\">{} ({})</text>",
            H - PAD + 16.0,
            esc(name),
            vals.len()
        );
    }
    s.push_str("</svg>");
    s
}

/// Bars per verb, one per controller side by side.
fn bar_chart(title: &str, counts: &[(Side, &Counts)]) -> String {
    let verbs: Vec<&str> = VERBS
        .iter()
        .copied()
        .filter(|v| counts.iter().any(|(_, c)| c.get(v) > 0))
        .collect();
    let max = verbs
        .iter()
        .flat_map(|v| counts.iter().map(|(_, c)| c.get(v)))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let mut s = svg_open(title);
    s.push_str(&axes("", "requests", 0.0, max));
    let (pw, ph) = (W - PAD - 16.0, H - PAD - 28.0);
    let group = pw / verbs.len().max(1) as f64;
    let bar = 0.7 / counts.len().max(1) as f64;
    for (i, verb) in verbs.iter().enumerate() {
        let gx = PAD + group * i as f64;
        for (k, (side, c)) in counts.iter().enumerate() {
            let n = c.get(verb);
            let bh = n as f64 / max * ph;
            let x = gx + group * (0.15 + bar * k as f64);
            let _ = write!(
                s,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"{}\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"9\">{n}</text>",
                H - PAD - bh,
                group * bar * 0.95,
                color(*side),
                x + group * bar / 2.0,
                H - PAD - bh - 2.0
            );
        }
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{verb}</text>",
            gx + group / 2.0,
            H - PAD + 14.0
        );
    }
    for (k, (side, _)) in counts.iter().enumerate() {
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>",
            W - 130.0,
            40.0 + 14.0 * k as f64,
            color(*side),
            side.title()
        );
    }
    s.push_str("</svg>");
    s
}
