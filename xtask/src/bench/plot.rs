//! `bench --plot FILE.svg`: bus bandwidth against message size (log axis), one line per system
//! (and per operation, dtype and reduction when the sweep had several), with the iperf3
//! ceiling as a dashed line.

use std::path::Path;

use plotters::prelude::*;

/// One line of the plot.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    /// Legend label.
    pub(crate) label: String,
    /// `(bytes, busbw GB/s)` points in size order.
    pub(crate) points: Vec<(u64, f64)>,
}

/// Colours that stay distinguishable on white, cycled when there are more lines.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// Draws `series` (and the `ceiling` in GB/s, when measured) into an SVG file at `path`.
pub(crate) fn draw(
    path: &Path,
    title: &str,
    series: &[Series],
    ceiling: Option<f64>,
) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("could not draw {}: {e}", path.display());
    let min_size = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .min()
        .unwrap_or(1)
        .max(1);
    let max_size = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .max()
        .unwrap_or(2)
        .max(min_size * 2);
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(ceiling)
        .fold(0.0f64, f64::max)
        .max(0.01)
        * 1.1;
    let root = SVGBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(log2(min_size)..log2(max_size), 0.0..top)
        .map_err(|e| fail(&e))?;
    // The x axis is log2 of the size, labelled in bytes, so that ticks fall on powers of two.
    chart
        .configure_mesh()
        .x_desc("message size (bytes, log scale)")
        .y_desc("bus bandwidth (GB/s)")
        .x_label_formatter(&|x| human_bytes(x.exp2().round() as u64))
        .draw()
        .map_err(|e| fail(&e))?;
    for (index, line) in series.iter().enumerate() {
        let color = PALETTE[index % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(
                line.points.iter().map(|&(bytes, gbps)| (log2(bytes), gbps)),
                color.stroke_width(2),
            ))
            .map_err(|e| fail(&e))?
            .label(line.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                line.points
                    .iter()
                    .map(|&(bytes, gbps)| Circle::new((log2(bytes), gbps), 3, color.filled())),
            )
            .map_err(|e| fail(&e))?;
    }
    if let Some(ceiling) = ceiling {
        let gray = RGBColor(110, 110, 110);
        let dashes = dashed(min_size, max_size, ceiling);
        chart
            .draw_series(
                dashes
                    .into_iter()
                    .map(|d| PathElement::new(d, gray.stroke_width(1))),
            )
            .map_err(|e| fail(&e))?
            .label(format!("iperf3, one loopback stream ({ceiling:.2} GB/s)"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], gray.stroke_width(1))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))
}

/// The x coordinate of a size.
fn log2(bytes: u64) -> f64 {
    (bytes.max(1) as f64).log2()
}

/// Short segments of a horizontal line at `y` across the x range of `min..max` bytes.
fn dashed(min: u64, max: u64, y: f64) -> Vec<Vec<(f64, f64)>> {
    let (lo, hi) = (log2(min), log2(max));
    let steps = 60;
    (0..steps)
        .step_by(2)
        .map(|i| {
            let at = |k: usize| lo + (hi - lo) * k as f64 / steps as f64;
            vec![(at(i), y), (at(i + 1), y)]
        })
        .collect()
}

/// `8`, `512`, `4K`, `256M`: the size labels of the x axis.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (scale, unit) in UNITS {
        if bytes >= scale && bytes % scale == 0 {
            return format!("{}{unit}", bytes / scale);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(human_bytes(8), "8");
        assert_eq!(human_bytes(4096), "4K");
        assert_eq!(human_bytes(256 << 20), "256M");
        assert_eq!(human_bytes(1500), "1500");
    }

    #[test]
    fn draws_an_svg_with_every_line() {
        let dir = std::env::temp_dir().join(format!("rlx-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("busbw.svg");
        let series = [
            Series {
                label: "rlx".to_owned(),
                points: vec![(8, 0.001), (1 << 20, 2.0), (256 << 20, 2.2)],
            },
            Series {
                label: "openmpi".to_owned(),
                points: vec![(8, 0.001), (1 << 20, 1.0)],
            },
        ];
        draw(&path, "all_reduce f32 sum, 2 ranks", &series, Some(3.2)).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("openmpi") && svg.contains("rlx") && svg.contains("iperf3"));
    }
}
