//! What a daemon knows that its catalogue does not: its pipelines' stages and its batch queue
//! now, and its Prometheus metrics. `forte dashboard` has none of it.

use std::collections::HashMap;

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

/// What the edge has put on the link and has ready for it, in sealed bytes: what the link
/// paces. Batches compress differently (the test set's first ones 4-8x, the next 3x), so an
/// ETA counted in raw bytes at the rate the first ones went overstates the next ones' pace;
/// counted in these it does not. Only the edge's daemon knows the sealed size of a part
/// before it is sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WireView {
    /// Sealed bytes the uploads' connections have taken since the daemon started, counted as
    /// they go (every attempt's): the link's rate, which the parts the relay accepted tell
    /// only seconds late, a part at a time.
    pub sent: u64,
    /// When the link last went from idle to busy (a part prepared with none waiting; µs since
    /// the epoch), and `sent` then: the node's rate runs from there, not from the last look
    /// before it.
    pub resumed: Option<(i64, u64)>,
    /// Raw and sealed bytes of every part prepared since the daemon started: the node's
    /// compression, for a batch with none prepared yet.
    pub prepared_raw: u64,
    pub prepared_sealed: u64,
    /// Of the parts prepared whose compression was estimated before (see [`BatchWire`]): the
    /// estimate's sealed bytes and theirs; how far the estimate is off at the level in use.
    pub estimated_prepared: (u64, u64),
    /// Per running batch (its catalogue key): what it has prepared.
    pub batches: HashMap<String, BatchWire>,
    /// The parts prepared and not yet sent, in the order they were prepared: the order the
    /// uploads take them in, whatever their batch.
    pub waiting: Vec<WaitingPart>,
}

/// A running batch's parts prepared at the edge, in raw and sealed bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BatchWire {
    /// Every part prepared so far, sent or not: the batch's compression.
    pub prepared_raw: u64,
    pub prepared_sealed: u64,
    /// Raw bytes of its parts prepared and not yet sent.
    pub waiting_raw: u64,
    /// Its raw bytes not prepared yet and their sealed bytes as estimated before it was
    /// prepared, from windows of its bytes compressed at zstd's fastest level
    /// (`forte_prepare::probe`): a batch whose data changes along the way (logs, then video)
    /// compresses unlike its parts so far.
    pub estimated_left: (u64, u64),
    /// Of its parts prepared that were estimated: the estimate's sealed bytes and theirs.
    pub estimated_prepared: (u64, u64),
}

/// A part prepared at the edge and not yet sent.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingPart {
    /// Its batch's catalogue key.
    pub batch: String,
    /// Its place in the order parts were prepared.
    pub seq: u64,
    pub sealed: u64,
    /// If it is being uploaded: the bytes of it its connection has taken so far (a retried
    /// upload counts from its start again).
    pub sending: Option<u64>,
}

/// Sealed bytes per raw byte, of `raw` raw bytes that sealed to `sealed`.
pub(crate) fn sealed_per_raw(raw: u64, sealed: u64) -> Option<f64> {
    (raw > 0).then(|| sealed as f64 / raw as f64)
}

/// A daemon's live view of itself, read at each request.
pub trait Live: Send + Sync + 'static {
    /// The stages of the pipelines running now.
    fn stages(&self) -> Vec<StageView>;
    /// The batch queue, where one runs.
    fn queue(&self) -> Option<QueueView>;
    /// Prometheus' text format, served at `/metrics`, where the daemon keeps metrics.
    fn metrics(&self) -> Option<String>;
    /// What the edge has put on and has ready for the link; `None` elsewhere.
    fn wire(&self) -> Option<WireView> {
        None
    }
}
