//! Charts as SVG written by hand (plain rectangles, lines and text: no font is needed to write
//! them), and PNG rendered from that SVG with resvg.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use forte_catalog::{TuningSample, UsageRow};

use crate::kpi::BatchKpi;

const WIDTH: f64 = 1000.0;
const LEFT: f64 = 150.0;
const RIGHT: f64 = 20.0;
const ROW: f64 = 22.0;
const TOP: f64 = 50.0;

/// Colours of the timeline: queueing before a task, then the task itself.
const QUEUE_SEND: &str = "#c8c8c8";
const SEND: &str = "#1f77b4";
const QUEUE_PULL: &str = "#ffbb78";
const PULL: &str = "#2ca02c";
/// The site's tasks, drawn over the lower half of the stage they run in: each task its colour
/// (in the order they first appear), its queueing the same lighter.
const TASKS: [(&str, &str); 4] = [
    ("#c5b0d5", "#9467bd"),
    ("#c49c94", "#8c564b"),
    ("#f7b6d2", "#e377c2"),
    ("#9edae5", "#17becf"),
];

/// The clock-time range every chart of one report shares (µs since the epoch), so that a
/// moment is at the same place on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeAxis {
    pub t0: i64,
    pub t1: i64,
}

impl TimeAxis {
    /// From the first to the last of `times` (at least a second).
    pub fn spanning(times: impl IntoIterator<Item = i64>) -> Self {
        let (mut t0, mut t1) = (i64::MAX, i64::MIN);
        for t in times {
            (t0, t1) = (t0.min(t), t1.max(t));
        }
        if t0 > t1 {
            (t0, t1) = (0, 0);
        }
        Self {
            t0,
            t1: t1.max(t0 + 1_000_000),
        }
    }

    /// The moments a report's charts show: batches' arrivals and task ends, and samples.
    pub fn of_report(batches: &[BatchKpi], usage: &[UsageRow], tuning: &[TuningSample]) -> Self {
        let batch_times = batches
            .iter()
            .flat_map(|b| std::iter::once(b.arrived).chain(b.stages.iter().map(|s| s.ended)));
        let samples = usage
            .iter()
            .map(|u| u.at)
            .chain(tuning.iter().map(|t| t.at));
        Self::spanning(batch_times.chain(samples))
    }

    fn seconds(&self) -> f64 {
        (self.t1 - self.t0) as f64 / 1e6
    }

    /// Where moment `t` is between `LEFT` and the right margin.
    fn x(&self, t: i64) -> f64 {
        LEFT + (t - self.t0) as f64 / 1e6 / self.seconds() * (WIDTH - LEFT - RIGHT)
    }

    /// Where the time from `from` to `to` is drawn.
    fn span(&self, from: i64, to: i64) -> Span {
        Span {
            left: self.x(from),
            right: self.x(to),
        }
    }
}

/// A stretch of a chart from `left` to `right`, in pixels from its left edge.
#[derive(Debug, Clone, Copy)]
struct Span {
    left: f64,
    right: f64,
}

/// A Gantt chart: one row per batch in arrival order; for each, the time queued before
/// `send`, `send`, the time waiting at the relay, and `pull`, on the clock-time axis `time`.
pub fn timeline_svg(title: &str, batches: &[BatchKpi], time: TimeAxis) -> String {
    // The site's tasks, in the order they first appear.
    let mut tasks: Vec<&str> = Vec::new();
    for t in batches.iter().flat_map(|b| &b.tasks) {
        if !tasks.contains(&t.task.as_str()) {
            tasks.push(&t.task);
        }
    }
    let legend_rows = (4 + tasks.len() + usize::from(!tasks.is_empty())).div_ceil(4) as f64;
    let height = TOP + ROW * batches.len() as f64 + 42.0 + 18.0 * legend_rows;
    let mut svg = header(WIDTH, height, title);
    axis(&mut svg, time, TOP + ROW * batches.len() as f64);
    for (i, b) in batches.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="12" text-anchor="end">{} ({})</text>"#,
            LEFT - 6.0,
            y + 15.0,
            escape(&b.label()),
            short_bytes(b.raw_bytes)
        );
        for s in &b.stages {
            let (queue, work) = if s.stage == forte_catalog::Stage::Send {
                (QUEUE_SEND, SEND)
            } else {
                (QUEUE_PULL, PULL)
            };
            bar(
                &mut svg,
                time.span(s.queued_from, s.started),
                y + 3.0,
                queue,
            );
            bar(&mut svg, time.span(s.started, s.ended), y + 3.0, work);
        }
        let half = y + 3.0 + (ROW - 6.0) / 2.0;
        for t in &b.tasks {
            let i = tasks.iter().position(|name| *name == t.task).unwrap_or(0);
            let (queued, running) = TASKS[i % TASKS.len()];
            task_bar(&mut svg, time.span(t.queued_from, t.started), half, queued);
            task_bar(&mut svg, time.span(t.started, t.ended), half, running);
            let _ = writeln!(
                svg,
                r#"<title>task {}: {:.2} s queued, {:.2} s running, {} tries</title>"#,
                escape(&t.task),
                t.queueing_s(),
                t.processing_s(),
                t.tries
            );
        }
    }
    let legend_y = TOP + ROW * batches.len() as f64 + 40.0;
    timeline_legend(&mut svg, &tasks, legend_y);
    svg.push_str("</svg>\n");
    svg
}

/// The timeline's legend from `legend_y` down: the stages' colours, then each of the site's
/// `tasks` in its own.
fn timeline_legend(svg: &mut String, tasks: &[&str], legend_y: f64) {
    let mut items: Vec<(&str, String)> = [
        (QUEUE_SEND, "queued at the edge"),
        (SEND, "send (prepare + upload)"),
        (QUEUE_PULL, "waiting at the relay"),
        (PULL, "pull (verify + deliver)"),
    ]
    .map(|(colour, label)| (colour, label.to_owned()))
    .into();
    for (i, name) in tasks.iter().enumerate() {
        let (_, running) = TASKS[i % TASKS.len()];
        items.push((running, format!("task {}", escape(name))));
    }
    if !tasks.is_empty() {
        items.push((TASKS[0].0, "a task queued (lighter)".to_owned()));
    }
    for (i, (colour, label)) in items.iter().enumerate() {
        let lx = LEFT + (i % 4) as f64 * 200.0;
        let legend_y = legend_y + (i / 4) as f64 * 18.0;
        let _ = writeln!(
            svg,
            r#"<rect x="{lx}" y="{}" width="14" height="12" fill="{colour}"/><text x="{}" y="{}" font-size="12">{label}</text>"#,
            legend_y - 10.0,
            lx + 18.0,
            legend_y
        );
    }
}

const NETWORK_SEND: &str = "network send";
const NETWORK_RECEIVE: &str = "network receive";

/// Utilisation over time, one panel per measure, one line per node: CPU % and memory of the
/// machine and of forte itself, disk read + write, network send and receive, on the
/// clock-time axis `time`.
pub fn utilisation_svg(title: &str, rows: &[UsageRow], time: TimeAxis) -> String {
    let measures: [Measure<UsageRow>; 7] = [
        Measure::new("CPU, the whole machine", |u| u.cpu_percent, "%"),
        Measure::new("CPU, forte's own share", |u| u.own_cpu_percent, "%"),
        Measure::new(
            "memory, the whole machine",
            |u| u.memory_used as f64 / 1e6,
            "MB",
        ),
        Measure::new("memory, forte's own", |u| u.own_memory as f64 / 1e6, "MB"),
        Measure::new(
            "disk read + write",
            |u| (u.disk_read_bps + u.disk_write_bps) / 1e6,
            "MB/s",
        ),
        Measure::new(NETWORK_SEND, |u| u.net_tx_bps / 1e6, "MB/s"),
        Measure::new(NETWORK_RECEIVE, |u| u.net_rx_bps / 1e6, "MB/s"),
    ];
    panels(title, rows, &measures, time)
}

/// The send's tuning over time, one line per sending node: the goodput each interval
/// measured, the uploads in flight it ran with, and the zstd level.
pub fn tuning_svg(title: &str, rows: &[TuningSample], time: TimeAxis) -> String {
    let measures: [Measure<TuningSample>; 3] = [
        Measure::new("goodput", |t| t.goodput / 1e6, "MB/s"),
        Measure::new("uploads in flight", |t| t.uploads as f64, "uploads"),
        Measure::new("zstd level", |t| t.level as f64, ""),
    ];
    panels(title, rows, &measures, time)
}

/// A measure drawn in a panel: its name, its value in a row, its unit.
struct Measure<R> {
    name: &'static str,
    value: fn(&R) -> f64,
    unit: &'static str,
}

impl<R> Measure<R> {
    fn new(name: &'static str, value: fn(&R) -> f64, unit: &'static str) -> Self {
        Self { name, value, unit }
    }
}

/// A row of a series drawn in panels: when it was taken (µs), on which node.
trait Sample {
    fn at(&self) -> i64;
    fn node(&self) -> &str;
}

impl Sample for UsageRow {
    fn at(&self) -> i64 {
        self.at
    }

    fn node(&self) -> &str {
        &self.node
    }
}

impl Sample for TuningSample {
    fn at(&self) -> i64 {
        self.at
    }

    fn node(&self) -> &str {
        &self.node
    }
}

/// Panels of lines over the time axis `time`, one panel per measure (its value axis ticked)
/// and one line per node.
fn panels<R: Sample>(title: &str, rows: &[R], measures: &[Measure<R>], time: TimeAxis) -> String {
    let colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let mut nodes: Vec<&str> = rows.iter().map(|r| r.node()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let panel = 150.0;
    if rows.is_empty() {
        // Axes over nothing read as a machine idle at 0 (and their scale is made up): say so.
        let mut svg = header(WIDTH, TOP + 60.0, title);
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="{}" font-size="14" fill="#666" text-anchor="middle">No samples yet: nothing recorded in this period.</text></svg>"##,
            WIDTH / 2.0,
            TOP + 30.0
        );
        return svg;
    }
    let height = TOP + panel * measures.len() as f64 + 40.0;
    let mut svg = header(WIDTH, height, title);
    let most = nodes
        .iter()
        .map(|n| rows.iter().filter(|r| r.node() == *n).count())
        .max();
    if most == Some(1) {
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="24" font-size="11" fill="#666" text-anchor="end">one sample per node (a run shorter than the sampling interval): dots, not lines</text>"##,
            WIDTH - RIGHT
        );
    }
    for (m, Measure { name, value, unit }) in measures.iter().enumerate() {
        let top = TOP + panel * m as f64;
        let bottom = top + panel - 40.0;
        let seen = rows.iter().map(value).fold(0.0, f64::max);
        // A measure that stayed at 0 keeps a readable axis (0 to 1 unit).
        let max = if seen > 0.0 { seen } else { 1.0 };
        // The network is sampled on every interface but loopback: a run on one machine
        // shows none, which says so rather than reading as an idle link.
        let network = [NETWORK_SEND, NETWORK_RECEIVE].contains(name);
        let note = if network && seen < 1e-3 {
            ": none measured (loopback is not counted)"
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r#"<text x="{LEFT}" y="{}" font-size="13">{name} (max {} {unit}){note}</text>"#,
            top - 4.0,
            value_label(seen, max)
        );
        axis(&mut svg, time, bottom);
        value_ticks(&mut svg, (top + 6.0, bottom), max, unit);
        for (n, node) in nodes.iter().enumerate() {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.node() == *node)
                .map(|r| {
                    (
                        time.x(r.at()),
                        bottom - value(r) / max * (bottom - top - 6.0),
                    )
                })
                .collect();
            let colour = colours[n % colours.len()];
            series(&mut svg, &points, colour);
            if m == 0 {
                let _ = writeln!(
                    svg,
                    r#"<text x="{}" y="{}" font-size="12" fill="{colour}">{}</text>"#,
                    WIDTH - RIGHT - 220.0,
                    top + 14.0 * (n as f64 + 1.0),
                    escape(node)
                );
            }
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// One node's series in a panel: a line through its points, or a dot where a run short for
/// the sampling interval left it one sample (a line needs two), nothing for none.
fn series(svg: &mut String, points: &[(f64, f64)], colour: &str) {
    match points {
        [] => {}
        [(x, y)] => {
            let _ = writeln!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{colour}"/>"#
            );
        }
        _ => {
            let points: String = points
                .iter()
                .map(|(x, y)| format!("{x:.1},{y:.1} "))
                .collect();
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>"#
            );
        }
    }
}

/// Writes `svg` to `path` and a PNG of it next to it (same name, `.png`).
pub fn write_svg_and_png(svg: &str, path: &Path) -> Result<()> {
    std::fs::write(path, svg).with_context(|| format!("cannot write {}", path.display()))?;
    let png = path.with_extension("png");
    let mut options = resvg::usvg::Options::default();
    options.fontdb_mut().load_system_fonts();
    if options.fontdb.is_empty() {
        anyhow::bail!(
            "no fonts found for the labels of {}: install a TrueType font (Debian: fonts-dejavu-core)",
            png.display()
        );
    }
    let tree = resvg::usvg::Tree::from_str(svg, &options)
        .with_context(|| format!("cannot read back the chart {}", path.display()))?;
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .context("the chart has no area")?;
    pixmap.fill(resvg::tiny_skia::Color::WHITE);
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    pixmap
        .save_png(&png)
        .with_context(|| format!("cannot write {}", png.display()))
}

fn header(width: f64, height: f64, title: &str) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="24" font-size="16" font-weight="bold">{}</text>
"#,
        escape(title)
    )
}

/// A bar half a row's bar high (a site task, over the lower half of its pull).
fn task_bar(svg: &mut String, span: Span, y: f64, colour: &str) {
    rect(svg, span, y, (ROW - 6.0) / 2.0, colour);
}

fn bar(svg: &mut String, span: Span, y: f64, colour: &str) {
    rect(svg, span, y, ROW - 6.0, colour);
}

fn rect(svg: &mut String, span: Span, y: f64, height: f64, colour: &str) {
    let Span {
        left: x0,
        right: x1,
    } = span;
    if x1 > x0 {
        let _ = writeln!(
            svg,
            r#"<rect x="{x0:.2}" y="{y:.1}" width="{:.2}" height="{height}" fill="{colour}"/>"#,
            x1 - x0
        );
    }
}

/// The time axis `time` at `y`, ticked in clock time (UTC) at round steps, about eight.
fn axis(svg: &mut String, time: TimeAxis, y: f64) {
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#444"/>"##,
        WIDTH - RIGHT
    );
    let step = tick_step(time.seconds() / 8.0);
    let step_us = (step * 1e6) as i64;
    let mut t = time.t0.div_euclid(step_us) * step_us;
    if t < time.t0 {
        t += step_us;
    }
    while t <= time.t1 {
        let x = time.x(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{y}" x2="{x:.1}" y2="{}" stroke="#444"/><text x="{x:.1}" y="{}" font-size="11" text-anchor="middle">{}</text>"##,
            y + 4.0,
            y + 16.0,
            clock(t, step)
        );
        t += step_us;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="end">UTC</text>"#,
        WIDTH - RIGHT,
        y + 30.0
    );
}

/// The round step at or above `raw` seconds: 1, 2 or 5 times a power of ten below a second,
/// then 1, 2, 5, 10, 15, 30 s, 1, 2, 5, 10, 15, 30 min, 1, 2, 3, 6, 12 h, days.
fn tick_step(raw: f64) -> f64 {
    if raw < 1.0 {
        let magnitude = 10f64.powf(raw.max(1e-3).log10().floor());
        return [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * magnitude)
            .find(|s| *s >= raw)
            .unwrap_or(1.0);
    }
    const STEPS: [f64; 17] = [
        1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0,
        10800.0, 21600.0, 43200.0,
    ];
    STEPS
        .into_iter()
        .find(|s| *s >= raw)
        .unwrap_or_else(|| (raw / 86_400.0).ceil() * 86_400.0)
}

/// Moment `t` (µs since the epoch) as UTC clock time, with tenths or hundredths when ticks
/// are that close.
fn clock(t: i64, step: f64) -> String {
    let seconds = t.div_euclid(1_000_000);
    let of_day = seconds.rem_euclid(86_400);
    let hms = format!(
        "{:02}:{:02}:{:02}",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    );
    // Ticks fall on multiples of the step, so the fraction is exact: "0.2" → ".2".
    let fraction = t.rem_euclid(1_000_000) as f64 / 1e6;
    let decimals = match step {
        s if s < 0.1 => 2,
        s if s < 1.0 => 1,
        _ => return hms,
    };
    let fraction = format!("{fraction:.decimals$}");
    format!("{hms}{}", &fraction[1..])
}

/// `value` on an axis that goes up to `max`, with as many decimals as tell its ticks apart: a
/// link that moved 0.04 MB/s reads 0.02 and 0.04, not 0.0 twice.
fn value_label(value: f64, max: f64) -> String {
    let decimals = if max > 0.0 && max < 1.0 {
        (-max.log10()).ceil() as usize + 1
    } else {
        1
    };
    format!("{value:.decimals$}")
}

/// Ticks on a panel's value axis from `bottom` up to `top` (pixels): 0, half and the most.
fn value_ticks(svg: &mut String, (top, bottom): (f64, f64), max: f64, unit: &str) {
    for share in [0.0, 0.5, 1.0] {
        let y = bottom - share * (bottom - top);
        let _ = writeln!(
            svg,
            r##"<line x1="{}" y1="{y:.1}" x2="{LEFT}" y2="{y:.1}" stroke="#444"/><text x="{}" y="{:.1}" font-size="10" text-anchor="end">{} {unit}</text>"##,
            LEFT - 4.0,
            LEFT - 6.0,
            y + 3.0,
            value_label(share * max, max)
        );
    }
}

fn short_bytes(bytes: u64) -> String {
    match bytes {
        b if b >= 1_000_000_000 => format!("{:.1} GB", b as f64 / 1e9),
        b if b >= 1_000_000 => format!("{:.0} MB", b as f64 / 1e6),
        b => format!("{:.0} kB", b as f64 / 1e3),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One codec setting on the speed-vs-ratio chart.
#[derive(Debug, Clone)]
pub struct TradeoffPoint {
    pub label: String,
    /// Points of one family share a colour.
    pub family: String,
    pub ratio: f64,
    pub mb_per_s: f64,
    pub pareto: bool,
    /// The setting `forte bench compress` recommends: ringed and labelled so.
    pub recommended: bool,
}

/// Compression speed (log scale) against ratio, like FORTE's Figure 6c, with the Pareto front
/// joined and the link's bound drawn: above the dashed line a setting is limited by the link
/// (link × ratio), below it by the CPU.
pub fn tradeoff_svg(title: &str, points: &[TradeoffPoint], link_mb_per_s: f64) -> String {
    let plot = TradeoffPlot::fit(points);
    let mut svg = header(WIDTH, 620.0, title);
    plot.axes(&mut svg);
    plot.link_bound(&mut svg, link_mb_per_s);
    plot.points(&mut svg, points);
    svg.push_str("</svg>\n");
    svg
}

/// The trade-off chart's frame: ratio on a linear x axis, MB/s on a log y axis spanning whole
/// decades.
struct TradeoffPlot {
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    x_min: f64,
    x_max: f64,
    /// Decades (log10) at the bottom and the top.
    y_lo: f64,
    y_hi: f64,
}

impl TradeoffPlot {
    fn fit(points: &[TradeoffPoint]) -> Self {
        let x_max = points.iter().map(|p| p.ratio).fold(1.0, f64::max) * 1.05;
        let x_min = points
            .iter()
            .map(|p| p.ratio)
            .fold(f64::MAX, f64::min)
            .min(1.0);
        let y_lo = points
            .iter()
            .map(|p| p.mb_per_s)
            .fold(f64::MAX, f64::min)
            .max(0.1)
            .log10()
            .floor();
        let y_hi = points
            .iter()
            .map(|p| p.mb_per_s)
            .fold(1.0, f64::max)
            .log10()
            .ceil()
            .max(y_lo + 1.0);
        Self {
            left: LEFT,
            right: WIDTH - RIGHT - 120.0,
            top: TOP + 10.0,
            bottom: 560.0,
            x_min,
            x_max,
            y_lo,
            y_hi,
        }
    }

    fn px(&self, ratio: f64) -> f64 {
        self.left + (ratio - self.x_min) / (self.x_max - self.x_min) * (self.right - self.left)
    }

    fn py(&self, mb: f64) -> f64 {
        self.bottom
            - (mb.max(1e-3).log10() - self.y_lo) / (self.y_hi - self.y_lo)
                * (self.bottom - self.top)
    }

    /// Both axes with their ticks, grid lines and titles.
    fn axes(&self, svg: &mut String) {
        let (left, right, top, bottom) = (self.left, self.right, self.top, self.bottom);
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#444"/><line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#444"/>"##
        );
        // Ratio ticks every 0.5 (or 1 beyond a span of 5).
        let step = if self.x_max - self.x_min > 5.0 {
            1.0
        } else {
            0.5
        };
        let mut r = (self.x_min / step).ceil() * step;
        while r <= self.x_max {
            let x = self.px(r);
            let _ = writeln!(
                svg,
                r##"<line x1="{x:.1}" y1="{bottom}" x2="{x:.1}" y2="{}" stroke="#444"/><text x="{x:.1}" y="{}" font-size="11" text-anchor="middle">{r:.1}</text>"##,
                bottom + 4.0,
                bottom + 16.0
            );
            r += step;
        }
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">compression ratio (raw / compressed)</text>"#,
            (left + right) / 2.0,
            bottom + 34.0
        );
        let mut decade = self.y_lo;
        while decade <= self.y_hi {
            for m in [1.0, 2.0, 5.0] {
                let v = m * 10f64.powf(decade);
                if v.log10() > self.y_hi + 1e-9 {
                    break;
                }
                let y = self.py(v);
                let _ = writeln!(
                    svg,
                    r##"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{v}</text>"##,
                    left - 6.0,
                    y + 4.0
                );
            }
            decade += 1.0;
        }
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="12" text-anchor="middle" transform="rotate(-90 {} {})">compression MB/s (log)</text>"#,
            left - 50.0,
            (top + bottom) / 2.0,
            left - 50.0,
            (top + bottom) / 2.0
        );
    }

    /// The link's bound: speed = link × ratio, dashed.
    fn link_bound(&self, svg: &mut String, link_mb_per_s: f64) {
        let (top, bottom) = (self.top, self.bottom);
        let bound: String = (0..=50)
            .map(|i| {
                let r = self.x_min + (self.x_max - self.x_min) * f64::from(i) / 50.0;
                format!(
                    "{:.1},{:.1} ",
                    self.px(r),
                    self.py(link_mb_per_s * r).clamp(top, bottom)
                )
            })
            .collect();
        let _ = writeln!(
            svg,
            r##"<polyline fill="none" stroke="#888" stroke-dasharray="6 4" points="{bound}"/><text x="{}" y="{:.1}" font-size="11" fill="#666">link {link_mb_per_s:.0} MB/s × ratio</text>"##,
            self.right + 4.0,
            self.py(link_mb_per_s * self.x_max).clamp(top, bottom)
        );
    }

    /// The settings, coloured by family, the Pareto front joined, and the legend. Labelled:
    /// the front, each family's best ratio (so a family off the front is named on the chart
    /// too) and the recommended setting, ringed; each label put where it overlaps no other.
    fn points(&self, svg: &mut String, points: &[TradeoffPoint]) {
        let colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
        let mut families: Vec<&str> = points.iter().map(|p| p.family.as_str()).collect();
        families.dedup();
        let mut front: Vec<&TradeoffPoint> = points.iter().filter(|p| p.pareto).collect();
        front.sort_by(|a, b| a.ratio.total_cmp(&b.ratio));
        let line: String = front
            .iter()
            .map(|p| format!("{:.1},{:.1} ", self.px(p.ratio), self.py(p.mb_per_s)))
            .collect();
        let _ = writeln!(
            svg,
            r##"<polyline fill="none" stroke="#000" stroke-width="1" points="{line}"/>"##
        );
        let best_of_family = |p: &TradeoffPoint| {
            points
                .iter()
                .filter(|q| q.family == p.family)
                .max_by(|a, b| a.ratio.total_cmp(&b.ratio))
                .is_some_and(|best| std::ptr::eq(best, p))
        };
        let mut placed: Vec<Box2> = Vec::new();
        // Dots first, so that labels avoid them too.
        for p in points {
            let (x, y) = (self.px(p.ratio), self.py(p.mb_per_s));
            placed.push((x - 4.5, y - 4.5, x + 4.5, y + 4.5));
        }
        for p in points {
            let n = families.iter().position(|f| *f == p.family).unwrap_or(0);
            let colour = colours[n % colours.len()];
            let (x, y) = (self.px(p.ratio), self.py(p.mb_per_s));
            let _ = writeln!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="{}" fill="{colour}"/>"#,
                if p.pareto { 4.5 } else { 3.0 }
            );
            if p.recommended {
                let _ = writeln!(
                    svg,
                    r##"<circle cx="{x:.1}" cy="{y:.1}" r="9" fill="none" stroke="#000" stroke-width="1.5"/>"##
                );
                placed.push((x - 9.0, y - 9.0, x + 9.0, y + 9.0));
            }
            if !(p.pareto || p.recommended || best_of_family(p)) {
                continue;
            }
            let text = match p.recommended {
                true => format!("{} (recommended)", p.label),
                false => p.label.clone(),
            };
            let (lx, ly) = self.label_place((x, y), &text, &placed);
            placed.push(label_box(lx, ly, &text));
            let weight = if p.recommended { "bold" } else { "normal" };
            let _ = writeln!(
                svg,
                r#"<text x="{lx:.1}" y="{ly:.1}" font-size="10" font-weight="{weight}" fill="{colour}">{}</text>"#,
                escape(&text)
            );
        }
        for (n, family) in families.iter().enumerate() {
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{}" font-size="12" fill="{}">● {}</text>"#,
                self.right + 10.0,
                self.top + 16.0 * (n as f64 + 1.0),
                colours[n % colours.len()],
                escape(family)
            );
        }
    }

    /// Where to put `text` beside the dot at `(x, y)`: the first of a few places around it
    /// that overlaps nothing `placed` and stays in the plot, else the first.
    fn label_place(&self, (x, y): (f64, f64), text: &str, placed: &[Box2]) -> (f64, f64) {
        let width = label_width(text);
        let candidates = [
            (x + 7.0, y - 5.0),
            (x + 7.0, y + 12.0),
            (x - 7.0 - width, y - 5.0),
            (x - 7.0 - width, y + 12.0),
            (x + 7.0, y - 17.0),
            (x + 7.0, y + 24.0),
            (x - 7.0 - width, y - 17.0),
            (x - 7.0 - width, y + 24.0),
        ];
        let fits = |&(lx, ly): &(f64, f64)| {
            let b = label_box(lx, ly, text);
            b.0 >= self.left
                && b.2 <= self.right
                && b.1 >= self.top
                && b.3 <= self.bottom
                && !placed.iter().any(|p| overlap(p, &b))
        };
        candidates
            .iter()
            .copied()
            .find(fits)
            .unwrap_or(candidates[0])
    }
}

/// A rectangle: left, top, right, bottom.
type Box2 = (f64, f64, f64, f64);

/// About how wide a 10-pixel label is (DejaVu Sans averages under 6 pixels a character).
fn label_width(text: &str) -> f64 {
    6.0 * text.chars().count() as f64
}

/// The box of a 10-pixel label whose baseline starts at `(x, y)`.
fn label_box(x: f64, y: f64, text: &str) -> Box2 {
    (x, y - 9.0, x + label_width(text), y + 2.0)
}

fn overlap(a: &Box2, b: &Box2) -> bool {
    a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(at: i64) -> UsageRow {
        UsageRow {
            node: "edge".into(),
            at,
            cpu_percent: 50.0,
            seconds: 1.0,
            memory_used: 1 << 30,
            disk_read_bps: 0.0,
            disk_write_bps: 0.0,
            net_tx_bps: 0.0,
            net_rx_bps: 0.0,
            own_cpu_percent: 1.0,
            own_memory: 1 << 20,
            item_latency: Default::default(),
        }
    }

    #[test]
    fn small_values_are_labelled_with_the_decimals_that_tell_them_apart() {
        // A network panel of a loopback run saw 0.04 MB/s at most: "0.0 MB/s" at every tick
        // said nothing.
        let mut svg = String::new();
        value_ticks(&mut svg, (0.0, 100.0), 0.04, "MB/s");
        for label in [">0.000 MB/s<", ">0.020 MB/s<", ">0.040 MB/s<"] {
            assert!(svg.contains(label), "{label} in {svg}");
        }
        assert_eq!(value_label(42.0, 84.0), "42.0");
        assert_eq!(value_label(0.5, 0.5), "0.50");
    }

    #[test]
    fn a_node_with_one_sample_is_a_dot_and_no_line_has_fewer_than_two_points() {
        // A 2 s demo run left the core's node one 1 Hz sample: its empty polylines made the
        // renderer warn once per panel (seven warnings) and drew nothing for it.
        let mut rows = vec![usage(0), usage(1_000_000), usage(2_000_000)];
        rows.push(UsageRow {
            node: "core".into(),
            ..usage(1_500_000)
        });
        let svg = utilisation_svg("t", &rows, TimeAxis::spanning([0, 2_000_000]));
        assert_eq!(
            svg.matches("<circle").count(),
            7,
            "one dot per panel for core"
        );
        assert!(!svg.contains("one sample per node"), "edge has lines");
        // Nothing on the network (loopback): the axis reads 0 to 1 MB/s, not 0.000000001.
        assert!(
            svg.contains(">1.0 MB/s<") && !svg.contains("0.0000"),
            "{svg}"
        );
        let one = utilisation_svg("t", &rows[3..], TimeAxis::spanning([0, 2_000_000]));
        assert!(one.contains("one sample per node"), "{one}");
        for line in svg.lines().filter(|l| l.starts_with("<polyline")) {
            let points = line
                .split("points=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            assert!(points.split_whitespace().count() >= 2, "{line}");
        }
    }

    /// The x of the tick labelled `label` in `svg`.
    fn tick_x(svg: &str, label: &str) -> Option<f64> {
        let end = svg.find(&format!(">{label}</text>"))?;
        let start = svg[..end].rfind("<text x=\"")? + "<text x=\"".len();
        svg[start..].split('"').next()?.parse().ok()
    }

    #[test]
    fn the_charts_of_one_report_share_one_clock_time_axis_with_ticks() {
        // Samples from 12:00:00 to 12:01:00 UTC on 2026-11-25; no batch yet.
        let noon = 1_795_608_000 * 1_000_000;
        let rows: Vec<UsageRow> = (0..=60).map(|s| usage(noon + s * 1_000_000)).collect();
        let time = TimeAxis::of_report(&[], &rows, &[]);
        assert_eq!(
            time,
            TimeAxis {
                t0: noon,
                t1: noon + 60_000_000
            }
        );
        let utilisation = utilisation_svg("u", &rows, time);
        let timeline = timeline_svg("t", &[], time);
        for svg in [&utilisation, &timeline] {
            assert!(svg.contains(">UTC</text>"), "{svg}");
        }
        // Ticks every 10 s, in clock time, at the same place on both charts.
        for label in ["12:00:00", "12:00:30", "12:01:00"] {
            let (u, t) = (tick_x(&utilisation, label), tick_x(&timeline, label));
            assert!(u.is_some() && u == t, "{label}: {u:?} and {t:?}");
        }
        // No traffic on the network panels: said, not drawn as an idle link.
        assert!(utilisation.contains("none measured (loopback is not counted)"));
        // forte's own CPU and memory beside the machine's.
        for panel in ["CPU, forte's own share", "memory, forte's own"] {
            assert!(utilisation.contains(panel), "no {panel} panel");
        }
        // The value axis is ticked: CPU up to 50 %.
        assert!(utilisation.contains(">50.0 %</text>"), "{utilisation}");
        assert!(utilisation.contains(">25.0 %</text>"), "{utilisation}");
    }

    #[test]
    fn every_family_and_the_recommended_setting_are_labelled_without_overlaps() {
        let point =
            |label: &str, family: &str, ratio: f64, mb_per_s: f64, pareto: bool| TradeoffPoint {
                label: label.into(),
                family: family.into(),
                ratio,
                mb_per_s,
                pareto,
                recommended: label == "zstd 3",
            };
        let mut points: Vec<TradeoffPoint> = (1..=19)
            .map(|level| {
                let ratio = 3.0 + f64::from(level) * 0.05;
                let speed = 900.0 / f64::from(level);
                point(
                    &format!("zstd {level}"),
                    "zstd",
                    ratio,
                    speed,
                    level % 2 == 1,
                )
            })
            .collect();
        points.push(point("gzip 6", "gzip", 3.1, 40.0, false));
        points.push(point("lz4", "lz4", 2.2, 700.0, false));
        let svg = tradeoff_svg("t", &points, 50.0);
        // (x, y, text) of every label beside a dot.
        let labels: Vec<(f64, f64, String)> = svg
            .lines()
            .filter(|l| l.starts_with("<text") && l.contains(r#"font-size="10""#))
            .map(|l| {
                let attr = |name: &str| -> f64 {
                    let at = l.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
                    l[at..].split('"').next().unwrap().parse().unwrap()
                };
                let text = l.split('>').nth(1).unwrap().trim_end_matches("</text");
                (attr("x"), attr("y"), text.to_string())
            })
            .collect();
        for named in ["gzip 6", "lz4", "zstd 3 (recommended)"] {
            assert!(
                labels.iter().any(|(_, _, t)| t == named),
                "{named} unlabelled: {labels:?}"
            );
        }
        for (i, a) in labels.iter().enumerate() {
            for b in &labels[i + 1..] {
                let (ba, bb) = (label_box(a.0, a.1, &a.2), label_box(b.0, b.1, &b.2));
                assert!(!overlap(&ba, &bb), "{a:?} overlaps {b:?}");
            }
        }
    }

    #[test]
    fn tick_steps_are_round_in_clock_time() {
        assert_eq!(tick_step(7.5), 10.0);
        assert_eq!(tick_step(40.0), 60.0);
        assert_eq!(tick_step(0.3), 0.5);
        assert_eq!(
            clock(1_795_608_000 * 1_000_000 + 250_000, 0.5),
            "12:00:00.2"
        );
    }
}
