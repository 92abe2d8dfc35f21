//! What the pipeline measured of itself: the KPIs of FORTE §2.2 computed from catalogue rows
//! ([`kpi`]), and charts of them ([`chart`]): a per-batch timeline and utilisation plots, as
//! SVG and PNG.

pub mod chart;
pub mod kpi;
