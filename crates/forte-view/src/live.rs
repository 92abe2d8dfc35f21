//! What a daemon knows that its catalogue does not: its pipelines' stages and its batch queue
//! now, and its Prometheus metrics. `forte dashboard` has none of it.

use forte_catalog::Role;
use serde::Serialize;

/// A pipeline stage now: `GET /api/v1/stages`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StageView {
    pub role: Role,
    pub stage: &'static str,
    /// What its items are (`object`, `part`).
    pub item: &'static str,
    pub workers: usize,
    pub queue_depth: usize,
    pub queue_capacity: usize,
    /// `queue_depth / queue_capacity`, 0 to 1.
    pub fill: f64,
    pub items: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub busy_s: f64,
    pub service_rate_bytes_per_second: f64,
}

/// A daemon's batch queue: what it admitted and has not finished.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct QueueView {
    pub role: Role,
    pub batches: usize,
    pub files: usize,
    pub bytes: u64,
}

/// A daemon's live view of itself, read at each request.
pub trait Live: Send + Sync + 'static {
    /// The stages of the pipelines running now.
    fn stages(&self) -> Vec<StageView>;
    /// The batch queue, where one runs.
    fn queue(&self) -> Option<QueueView>;
    /// Prometheus' text format, served at `/metrics`, where the daemon keeps metrics.
    fn metrics(&self) -> Option<String>;
}
