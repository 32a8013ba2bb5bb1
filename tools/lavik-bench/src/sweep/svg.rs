//! Hand-written SVG line charts: a grid of panels, log2 x axis, linear y axis from zero.
//!
//! Kept deliberately small (no plotting crate): the charts are a few polylines, axes and
//! labels, and the output stays readable and diffable as text.

use std::fmt::Write;

const PANEL_WIDTH: f64 = 480.0;
const PANEL_HEIGHT: f64 = 300.0;
const MARGIN_LEFT: f64 = 72.0;
const MARGIN_RIGHT: f64 = 18.0;
const MARGIN_TOP: f64 = 34.0;
const MARGIN_BOTTOM: f64 = 46.0;
const HEADER_HEIGHT: f64 = 64.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// One line: a server's values against connection count.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (used for reference measurements such as redis-benchmark's).
    pub dashed: bool,
}

const DASH: &str = r#" stroke-dasharray="6 4""#;

#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

/// Round `max` up to a 1-2-5 step grid; returns (axis top, step).
pub fn nice_axis(max: f64) -> (f64, f64) {
    if max <= 0.0 || !max.is_finite() {
        return (1.0, 0.2);
    }
    let raw_step = max / 5.0;
    let magnitude = 10f64.powf(raw_step.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw_step)
        .unwrap_or(10.0 * magnitude);
    ((max / step).ceil() * step, step)
}

/// Short tick labels: 1.5M, 250k, 0.25.
pub fn short_number(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if v.abs() >= 1e6 {
        format!("{}M", trim(format!("{:.2}", v / 1e6)))
    } else if v.abs() >= 1e3 {
        format!("{}k", trim(format!("{:.1}", v / 1e3)))
    } else {
        trim(format!("{v:.3}"))
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Render panels in a grid of `columns`, with a title and a shared legend.
pub fn render(title: &str, subtitle: &str, panels: &[Panel], columns: usize) -> String {
    let columns = columns.max(1);
    let rows = panels.len().div_ceil(columns);
    let width = PANEL_WIDTH * columns as f64;
    let height = HEADER_HEIGHT + PANEL_HEIGHT * rows as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="16" font-weight="bold">{}</text>"#,
        width / 2.0,
        escape(title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="38" text-anchor="middle" fill="#555">{}</text>"##,
        width / 2.0,
        escape(subtitle)
    );
    let names = series_names(panels);
    legend(&mut s, &names, width);
    for (i, panel) in panels.iter().enumerate() {
        let x0 = PANEL_WIDTH * (i % columns) as f64;
        let y0 = HEADER_HEIGHT + PANEL_HEIGHT * (i / columns) as f64;
        draw_panel(&mut s, panel, &names, x0, y0);
    }
    s.push_str("</svg>\n");
    s
}

/// Every series name once, in first-seen order; a name's index picks its colour in all
/// panels, so one server has one colour throughout.
fn series_names(panels: &[Panel]) -> Vec<(&str, bool)> {
    let mut names: Vec<(&str, bool)> = Vec::new();
    for series in panels.iter().flat_map(|p| &p.series) {
        if !names.iter().any(|(n, _)| *n == series.name) {
            names.push((&series.name, series.dashed));
        }
    }
    names
}

fn color_of(name: &str, all: &[(&str, bool)]) -> &'static str {
    let i = all.iter().position(|(n, _)| *n == name).unwrap_or(0);
    COLORS[i % COLORS.len()]
}

fn legend(s: &mut String, names: &[(&str, bool)], width: f64) {
    let item_width = if names.len() > 3 { 220.0 } else { 150.0 };
    let mut x = width / 2.0 - item_width * names.len() as f64 / 2.0;
    for (name, dashed) in names {
        let color = color_of(name, names);
        let dash = if *dashed { DASH } else { "" };
        let _ = writeln!(
            s,
            r#"<line x1="{x}" y1="54" x2="{}" y2="54" stroke="{color}" stroke-width="3"{dash}/><text x="{}" y="58">{}</text>"#,
            x + 24.0,
            x + 30.0,
            escape(name)
        );
        x += item_width;
    }
}

fn draw_panel(s: &mut String, panel: &Panel, names: &[(&str, bool)], x0: f64, y0: f64) {
    let plot_w = PANEL_WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_h = PANEL_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
    let (left, top) = (x0 + MARGIN_LEFT, y0 + MARGIN_TOP);
    let xs = panel
        .series
        .iter()
        .flat_map(|ser| ser.points.iter().map(|p| p.0));
    let (mut lo, mut hi) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if lo > hi {
        (lo, hi) = (1.0, 2.0);
    }
    let (lo2, mut hi2) = (lo.max(1.0).log2().floor(), hi.max(1.0).log2().ceil());
    if hi2 <= lo2 {
        hi2 = lo2 + 1.0;
    }
    let y_max = panel
        .series
        .iter()
        .flat_map(|ser| ser.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let (y_top, y_step) = nice_axis(y_max);
    let px = |x: f64| left + (x.max(1.0).log2() - lo2) / (hi2 - lo2) * plot_w;
    let py = |y: f64| top + plot_h - y / y_top * plot_h;

    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="14" font-weight="bold">{}</text>"#,
        left + plot_w / 2.0,
        y0 + 22.0,
        escape(&panel.title)
    );
    // Horizontal grid and y labels.
    let mut y = 0.0;
    while y <= y_top + y_step / 2.0 {
        let yy = py(y);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + plot_w,
            left - 6.0,
            yy + 4.0,
            short_number(y)
        );
        y += y_step;
    }
    // Vertical grid at powers of two.
    let mut e = lo2;
    while e <= hi2 {
        let xx = px(2f64.powf(e));
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="#eee"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            top + plot_h,
            top + plot_h + 16.0,
            2f64.powf(e)
        );
        e += 1.0;
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">connections (log2 scale)</text>"#,
        left + plot_w / 2.0,
        top + plot_h + 36.0
    );
    let (lx, ly) = (x0 + 16.0, top + plot_h / 2.0);
    let _ = writeln!(
        s,
        r#"<text x="{lx}" y="{ly}" text-anchor="middle" transform="rotate(-90 {lx} {ly})">{}</text>"#,
        escape(&panel.y_label)
    );
    for ser in panel.series.iter().filter(|ser| !ser.points.is_empty()) {
        let color = color_of(&ser.name, names);
        let dash = if ser.dashed { DASH } else { "" };
        let mut pts: Vec<(f64, f64)> = ser.points.clone();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = pts
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            path.join(" ")
        );
        for (x, y) in &pts {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"><title>{} @ {x}: {y:.3}</title></circle>"#,
                px(*x),
                py(*y),
                escape(&ser.name)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves axis tops land on a 1-2-5 grid at or above the data maximum.
    #[test]
    fn nice_axes() {
        assert_eq!(nice_axis(93_000.0), (100_000.0, 20_000.0));
        assert_eq!(nice_axis(0.87), (1.0, 0.2));
        assert_eq!(nice_axis(4.2), (5.0, 1.0));
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
        let (top, step) = nice_axis(123_456.0);
        assert!(top >= 123_456.0 && (top / step - (top / step).round()).abs() < 1e-9);
    }

    // Proves tick labels are short and unit-suffixed.
    #[test]
    fn labels() {
        assert_eq!(short_number(250_000.0), "250k");
        assert_eq!(short_number(1_500_000.0), "1.5M");
        assert_eq!(short_number(0.25), "0.25");
        assert_eq!(short_number(0.0), "0");
    }

    // Proves a chart has one polyline per series per panel, log2 ticks, and escaped text.
    #[test]
    fn renders_panels() {
        let series = |n: &str| Series {
            name: n.into(),
            points: vec![(1.0, 10.0), (4.0, 30.0), (16.0, 20.0)],
            dashed: n == "b",
        };
        let panel = Panel {
            title: "GET <throughput>".into(),
            y_label: "ops/s".into(),
            series: vec![series("a"), series("b")],
        };
        let svg = render("t", "sub", &[panel.clone(), panel], 2);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 4);
        // Series b is dashed in both panels and in the legend.
        assert_eq!(svg.matches("stroke-dasharray").count(), 3);
        assert!(svg.contains("GET &lt;throughput&gt;"));
        for tick in [
            ">1</text>",
            ">2</text>",
            ">4</text>",
            ">8</text>",
            ">16</text>",
        ] {
            assert!(svg.contains(tick), "missing x tick {tick}");
        }
    }
}
