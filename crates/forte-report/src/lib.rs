//! What the pipeline measured of itself: the KPIs of FORTE §2.2 computed from catalogue rows
//! ([`kpi`]), and charts of them ([`chart`]): a per-batch timeline and utilisation plots, as
//! SVG and PNG.

pub mod chart;
pub mod kpi;
pub mod print;
pub mod status;
pub mod summary;
pub mod words;

/// A size for people: `1.50 GiB`.
pub fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", units[unit])
    }
}
