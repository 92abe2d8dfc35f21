//! What a running edge batch's raw bytes not prepared yet will seal to: the link paces sealed
//! bytes, and batches compress differently.

use super::Batch;
use crate::live::{sealed_per_raw, BatchWire, WireView};

/// The sealed bytes a running edge batch will be once its raw bytes not prepared yet are.
pub(super) fn unprepared_sealed(b: &Batch, wire: &WireView) -> f64 {
    let mine = wire.batches.get(&b.key).copied().unwrap_or_default();
    (b.bytes - b.done_bytes - mine.waiting_raw as i64).max(0) as f64 * per_raw_left(&mine, wire)
}

/// Sealed bytes per raw byte of what a batch has not prepared yet: the estimate made before
/// it was prepared, scaled by how its parts prepared so far sealed against theirs, drawn
/// towards the node's scale while it has prepared little ([`SCALE_PRIOR`]); without an
/// estimate, its compression so far (the node's, before it has any).
fn per_raw_left(mine: &BatchWire, wire: &WireView) -> f64 {
    let so_far = sealed_per_raw(mine.prepared_raw, mine.prepared_sealed)
        .or_else(|| sealed_per_raw(wire.prepared_raw, wire.prepared_sealed));
    let (raw, estimated) = mine.estimated_left;
    let Some(left) = sealed_per_raw(raw, estimated) else {
        return so_far.unwrap_or(1.0);
    };
    let (estimate, sealed) = mine.estimated_prepared;
    let node = sealed_per_raw(wire.estimated_prepared.0, wire.estimated_prepared.1);
    let scale = match node {
        Some(node) => Some((sealed as f64 + SCALE_PRIOR * node) / (estimate as f64 + SCALE_PRIOR)),
        None => sealed_per_raw(estimate, sealed),
    };
    match scale {
        Some(scale) => left * scale,
        None => so_far.unwrap_or(left),
    }
}

/// How much of a batch's estimate the node's scale counts as, in sealed bytes, when a batch's
/// scale is worked out from its parts prepared so far. A batch's first two or three parts are
/// a poor guide to the rest: the test set's N sealed its first 32 MB to 1.37 × the estimate
/// and the rest to 1.02 ×, and scaled by its first parts alone its ETA read 22 % long 3.5 s
/// in (docs/benchmarks/log/2026-11.md). Drawn towards the node's scale by a few parts' worth,
/// its own takes over as it prepares more.
const SCALE_PRIOR: f64 = 8e6;
