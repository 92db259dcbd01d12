//! The doctor's picture of the cluster (`rlx doctor --svg FILE`): the ranks on a circle, each
//! pair that a cable or a switch joins as a line labelled with the measured bandwidth and
//! round trip, a declared cable the link matrix lacks as a red dashed line, the slowest pair
//! in orange, and the plan of the collectives underneath. A plain SVG, drawn from the reports
//! alone, that any browser shows.

use std::f64::consts::PI;
use std::fmt::Write as _;

use rlx_transport::Reach;

use super::RankReport;
use super::advice::{declared_cabling, rates_slowest_first, reach_between};

/// Side of the square the ranks are drawn in, in pixels; the plan goes below it.
const SIDE: f64 = 640.0;
/// Radius of the circle the ranks sit on.
const RADIUS: f64 = 230.0;

/// Where rank `index` of `n` sits on the circle.
fn position(index: usize, n: usize) -> (f64, f64) {
    let angle = 2.0 * PI * index as f64 / n.max(1) as f64 - PI / 2.0;
    (
        SIDE / 2.0 + RADIUS * angle.cos(),
        SIDE / 2.0 + RADIUS * angle.sin(),
    )
}

/// The picture of `reports` as an SVG document.
pub fn svg(reports: &[RankReport]) -> String {
    let mut out = String::new();
    let height = SIDE + 90.0;
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{SIDE}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/>"
    );
    draw_links(&mut out, reports);
    let n = reports.len();
    for (i, report) in reports.iter().enumerate() {
        let (x, y) = position(i, n);
        let _ = writeln!(
            out,
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"30\" fill=\"#eef\" stroke=\"#246\" \
             stroke-width=\"2\"/>\n<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" \
             font-weight=\"bold\">rank {}</text>\n<text x=\"{x:.1}\" y=\"{:.1}\" \
             text-anchor=\"middle\" font-size=\"10\">{}</text>",
            y - 2.0,
            report.rank,
            y + 12.0,
            escape(&report.host)
        );
    }
    for (i, line) in plan_lines(reports).iter().enumerate() {
        let y = SIDE + 20.0 + 18.0 * i as f64;
        let _ = writeln!(out, "<text x=\"20\" y=\"{y:.1}\">{}</text>", escape(line));
    }
    out.push_str("</svg>\n");
    out
}

/// Draws every pair that a cable or a switch joins, or that the declared cabling says a
/// cable should, as a line with its label.
fn draw_links(out: &mut String, reports: &[RankReport]) {
    let n = reports.len();
    let slowest = slowest_pair(reports);
    let missing = missing_pairs(reports);
    for a in 0..n {
        for b in a + 1..n {
            let pair = [a as u32, b as u32];
            let is_missing = missing.contains(&pair);
            let style = match (is_missing, reach_between(reports, pair[0], pair[1])) {
                (true, _) => "stroke=\"#d00\" stroke-width=\"2\" stroke-dasharray=\"8 5\"",
                (false, Some(Reach::Cable)) => "stroke=\"#246\" stroke-width=\"4\"",
                (false, Some(Reach::Switch)) => {
                    "stroke=\"#999\" stroke-width=\"1.5\" stroke-dasharray=\"4 4\""
                }
                // A routed pair has no link of its own to draw.
                _ => continue,
            };
            let ((x1, y1), (x2, y2)) = (position(a, n), position(b, n));
            let _ = writeln!(
                out,
                "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" {style}/>"
            );
            let (colour, label) = if is_missing {
                ("#d00", "missing cable".to_owned())
            } else if slowest == Some(pair) {
                ("#d70", measured(reports, pair[0], pair[1]))
            } else {
                ("#222", measured(reports, pair[0], pair[1]))
            };
            // Two fifths of the way from the lower rank, so that the labels of crossing lines
            // (the diagonals of a square) do not land on one spot.
            let (mx, my) = (x1 + 0.4 * (x2 - x1), y1 + 0.4 * (y2 - y1));
            let _ = writeln!(
                out,
                "<text x=\"{mx:.1}\" y=\"{my:.1}\" text-anchor=\"middle\" fill=\"{colour}\" \
                 stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\">{}</text>",
                escape(&label)
            );
        }
    }
}

/// What the lower rank of a pair measured of it: `1.23 GB/s · 45 µs`.
fn measured(reports: &[RankReport], a: u32, b: u32) -> String {
    let peer = reports
        .iter()
        .find(|r| r.rank == a)
        .and_then(|r| r.peers.iter().find(|p| p.peer == b));
    match peer.and_then(|p| Some((p.gbytes_per_s?, p.rtt_median_us?))) {
        Some((rate, rtt)) => format!("{rate:.2} GB/s · {rtt:.0} µs"),
        None => "not measured".to_owned(),
    }
}

/// The slowest measured pair, when there are three pairs or more to compare.
fn slowest_pair(reports: &[RankReport]) -> Option<[u32; 2]> {
    let rates = rates_slowest_first(reports);
    rates
        .first()
        .filter(|_| rates.len() >= 3)
        .map(|&(_, pair)| pair)
}

/// The declared cables the link matrix lacks, the lower rank first.
fn missing_pairs(reports: &[RankReport]) -> Vec<[u32; 2]> {
    let Some(declared) = declared_cabling(reports) else {
        return Vec::new();
    };
    let reach = |a, b| reach_between(reports, a, b).unwrap_or(Reach::Routed);
    declared
        .missing_cables(reports.len() as u32, reach)
        .map(|missing| missing.into_iter().map(|(pair, _)| pair).collect())
        .unwrap_or_default()
}

/// The lines under the picture: the declared cabling, the rings' order and the plan.
fn plan_lines(reports: &[RankReport]) -> Vec<String> {
    let Some(first) = reports.first() else {
        return vec!["no rank reported".to_owned()];
    };
    let mut lines = Vec::new();
    if let Some(declared) = &first.declared_cabling {
        lines.push(format!("declared cabling: {declared}"));
    }
    if !first.ring_order.is_empty() {
        let order: Vec<String> = first.ring_order.iter().map(u32::to_string).collect();
        lines.push(format!("rings visit the ranks as {}", order.join("-")));
    }
    if !first.plan.is_empty() {
        lines.push(format!("plan at 64 MiB: {}", first.plan.join(", ")));
    }
    lines.push("thick blue: cable · dashed grey: switch · dashed red: missing cable · orange: slowest pair".to_owned());
    lines
}

/// `text` with the characters XML gives a meaning escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
