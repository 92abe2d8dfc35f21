//! What needs a look: batches stalled or held back, and the stage that holds back its pipeline.

use forte_catalog::BatchState;
use serde::Serialize;

use super::{Batch, HOUR_US};
use crate::live::StageView;

/// Something that needs a look.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Alert {
    pub level: AlertLevel,
    pub text: String,
}

/// How soon an alert needs a look.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AlertLevel {
    Warning,
    Critical,
}

/// A stage's queue is red from this fill on (NiFi's back-pressure colours), yellow from
/// [`FILL_WARNING`].
pub const FILL_CRITICAL: f64 = 0.85;
pub const FILL_WARNING: f64 = 0.6;
/// A running batch that has not changed for this long is stalled.
const STALLED_US: i64 = 5 * 60 * 1_000_000;

/// A warning if the running `batch`, idle for `idle` µs, is stalled; a queued one waits its
/// turn.
pub(super) fn stalled(batch: &Batch, idle: i64) -> Option<Alert> {
    (batch.state != BatchState::Queued && idle > STALLED_US).then(|| Alert {
        level: AlertLevel::Warning,
        text: format!(
            "batch {} ({}) has not moved for {} minutes",
            batch.name,
            batch.role,
            idle / 60_000_000
        ),
    })
}

/// A critical alert if the batch `b` failed or was quarantined within the hour before `now`.
pub(super) fn held_back(b: &Batch, now: i64) -> Option<Alert> {
    let failed = matches!(b.state, BatchState::Failed | BatchState::Quarantined);
    (failed && now - b.updated_us < HOUR_US).then(|| Alert {
        level: AlertLevel::Critical,
        text: format!(
            "batch {} ({}) {}: {}",
            b.name,
            b.role,
            b.state,
            b.error.as_deref().unwrap_or("see its failures")
        ),
    })
}

/// The stage that holds back its pipeline, if any. Back-pressure fills every queue upstream of
/// the slowest stage, so it is the last stage (in pipeline order) whose queue is nearly full. A
/// queue of one item is a hand-off, full whenever its stage waits for any reason: it tells
/// nothing.
pub(super) fn bottleneck(stages: &[StageView]) -> Option<Alert> {
    let s = stages
        .iter()
        .rfind(|s| s.queue_capacity > 1 && s.fill >= FILL_CRITICAL)?;
    Some(Alert {
        level: AlertLevel::Warning,
        text: format!(
            "the {} stage ({}) holds back the pipeline: its queue is {:.0} % full",
            s.stage,
            s.role,
            100.0 * s.fill
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use forte_catalog::Role;

    fn stage(stage: &'static str, depth: usize, capacity: usize) -> StageView {
        StageView {
            role: Role::Edge,
            stage,
            item: "part",
            workers: 1,
            queue_depth: depth,
            queue_capacity: capacity,
            fill: depth as f64 / capacity as f64,
            items: 0,
            bytes_in: 0,
            bytes_out: 0,
            busy_s: 0.0,
            service_rate_bytes_per_second: 0.0,
        }
    }

    #[test]
    fn the_bottleneck_is_the_last_full_queue_and_never_a_hand_off() {
        // As seen sending A–N at 10 MB/s: the read hand-off full, the uploads' queue 11/12.
        let link_bound = [
            stage("read", 1, 1),
            stage("hash", 12, 12),
            stage("compress", 0, 12),
            stage("sink", 11, 12),
        ];
        let alert = bottleneck(&link_bound).unwrap();
        assert!(alert.text.starts_with("the sink stage"), "{}", alert.text);
        assert_eq!(
            bottleneck(&[stage("read", 1, 1), stage("sink", 10, 12)]),
            None
        );
    }
}
