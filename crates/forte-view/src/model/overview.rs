//! The front page in one answer: the batches in flight and lately changed, the newest failures,
//! alerts and totals, over every catalogue.

use anyhow::Result;
use forte_catalog::{BatchState, Catalog};
use serde::Serialize;

use super::alerts::{bottleneck, STALLED_US};
use super::batch::finished;
use super::eta::EndedBytes;
use super::{running, Alert, AlertLevel, Batch, FailureView, Progress, HOUR_US};
use crate::live::{QueueView, StageView, WireView};

#[derive(Debug, Clone, Serialize, Default)]
pub struct Totals {
    pub batches: usize,
    /// Sent by the edge (its rows): sent, and perhaps their sources deleted since.
    pub sent: usize,
    pub delivered: usize,
    pub failed: usize,
    pub bytes: i64,
}

/// The front page in one answer: `GET /api/v1/overview`, and each server-sent event.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub at_us: i64,
    pub in_flight: Vec<Batch>,
    pub recent: Vec<Batch>,
    pub stages: Vec<StageView>,
    pub queue: Option<QueueView>,
    pub failures: Vec<FailureView>,
    pub alerts: Vec<Alert>,
    pub totals: Totals,
}

impl Overview {
    pub fn read(
        catalogs: &[Catalog],
        stages: Vec<StageView>,
        queue: Option<QueueView>,
        wire: Option<WireView>,
        progress: &Progress,
    ) -> Result<Self> {
        let now = forte_catalog::now_us();
        let mut in_flight = vec![];
        let mut recent = vec![];
        let mut failures = vec![];
        let mut totals = Totals::default();
        let mut alerts = vec![];
        let mut newest_rows = vec![];
        let mut ended = EndedBytes::new();
        for catalog in catalogs {
            let rows = catalog.batches()?;
            totals.batches += rows.len();
            for row in &rows {
                if finished(row.state) {
                    *ended.entry(row.role).or_default() += row.bytes.max(0);
                }
                totals.delivered += usize::from(row.state == BatchState::Delivered);
                totals.sent += usize::from(matches!(
                    row.state,
                    BatchState::Sent | BatchState::SourceDeleted | BatchState::SourceKept
                ));
                totals.failed += usize::from(matches!(
                    row.state,
                    BatchState::Failed | BatchState::Quarantined
                ));
                totals.bytes += row.bytes.max(0);
            }
            let mut newest = rows.clone();
            newest.sort_by_key(|r| std::cmp::Reverse(r.updated_at));
            newest.truncate(20);
            newest_rows.push((catalog, newest));
            for row in rows.into_iter().filter(|r| running(r.state)) {
                let last_moved = catalog.last_event(&row.batch_key)?;
                let batch = Batch::of(catalog, row, progress, now)?;
                let idle = now - last_moved.unwrap_or(batch.updated_us);
                if batch.state != BatchState::Queued && idle > STALLED_US {
                    alerts.push(Alert {
                        level: AlertLevel::Warning,
                        text: format!(
                            "batch {} ({}) has not moved for {} minutes",
                            batch.name,
                            batch.role,
                            idle / 60_000_000
                        ),
                    });
                }
                in_flight.push(batch);
            }
            failures.extend(
                catalog
                    .failures(None, 10)?
                    .into_iter()
                    .map(FailureView::from),
            );
        }
        progress.queue_etas(&mut in_flight, &ended, wire.as_ref(), now);
        // A running batch among the newest is the one just read, with its ETA; the others are
        // read now.
        for (catalog, rows) in newest_rows {
            for row in rows {
                let key = row.batch_key.to_string();
                match in_flight.iter().find(|b| b.key == key) {
                    Some(batch) => recent.push(batch.clone()),
                    None => recent.push(Batch::of(catalog, row, progress, now)?),
                }
            }
        }
        for b in &recent {
            let held_back = matches!(b.state, BatchState::Failed | BatchState::Quarantined);
            if held_back && now - b.updated_us < HOUR_US {
                alerts.push(Alert {
                    level: AlertLevel::Critical,
                    text: format!(
                        "batch {} ({}) {}: {}",
                        b.name,
                        b.role,
                        b.state,
                        b.error.as_deref().unwrap_or("see its failures")
                    ),
                });
            }
        }
        alerts.extend(bottleneck(&stages));
        // Those under way first, in the order they began; then the queued, as they arrived.
        in_flight.sort_by_key(|b| (b.state == BatchState::Queued, b.started_us, b.arrived_us));
        recent.sort_by_key(|b| std::cmp::Reverse(b.updated_us));
        recent.truncate(20);
        failures.sort_by_key(|f| std::cmp::Reverse(f.at_us));
        failures.truncate(10);
        Ok(Self {
            at_us: now,
            in_flight,
            recent,
            stages,
            queue,
            failures,
            alerts,
            totals,
        })
    }
}
