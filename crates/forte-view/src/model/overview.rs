//! The front page in one answer: the batches in flight and lately changed, the newest failures,
//! alerts and totals, over every catalogue.

use anyhow::Result;
use forte_catalog::{BatchRow, BatchState, Catalog};
use serde::Serialize;

use super::alerts::{bottleneck, held_back, stalled};
use super::batch::finished;
use super::eta::EndedBytes;
use super::{running, Alert, Batch, FailureView, Progress};
use crate::live::{QueueView, StageView, WireView};

/// The batches every catalogue holds, counted by how they ended, and their bytes.
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
    /// Reads every catalogue now, beside the daemon's live `stages`, `queue` and `wire`.
    pub fn read(
        catalogs: &[Catalog],
        stages: Vec<StageView>,
        queue: Option<QueueView>,
        wire: Option<WireView>,
        progress: &Progress,
    ) -> Result<Self> {
        let now = forte_catalog::now_us();
        let mut look = Look::default();
        for catalog in catalogs {
            look.read(catalog, progress, now)?;
        }
        let Look {
            totals,
            ended,
            newest,
            mut in_flight,
            stalled: mut alerts,
            mut failures,
        } = look;
        progress.queue_etas(&mut in_flight, &ended, wire.as_ref(), now);
        let mut recent = recent(newest, &in_flight, progress, now)?;
        alerts.extend(recent.iter().filter_map(|b| held_back(b, now)));
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

impl Totals {
    /// Counts the batch `row` in.
    fn count(&mut self, row: &BatchRow) {
        self.delivered += usize::from(row.state == BatchState::Delivered);
        self.sent += usize::from(matches!(
            row.state,
            BatchState::Sent | BatchState::SourceDeleted | BatchState::SourceKept
        ));
        self.failed += usize::from(matches!(
            row.state,
            BatchState::Failed | BatchState::Quarantined
        ));
        self.bytes += row.bytes.max(0);
    }
}

/// What one look over the catalogues gathers before the running batches' ETAs can be worked
/// out: those take every catalogue's running batches at once.
#[derive(Default)]
struct Look<'c> {
    totals: Totals,
    ended: EndedBytes,
    newest: Vec<NewestRows<'c>>,
    /// The running batches, each read at the look.
    in_flight: Vec<Batch>,
    /// Alerts for those that have not moved for a while.
    stalled: Vec<Alert>,
    failures: Vec<FailureView>,
}

/// A catalogue's most lately changed batch rows, read as batches once the ETAs are known.
struct NewestRows<'c> {
    catalog: &'c Catalog,
    rows: Vec<BatchRow>,
}

impl<'c> Look<'c> {
    /// Adds `catalog`'s batches at `now`: its totals, its running batches, its newest rows and
    /// its newest failures.
    fn read(&mut self, catalog: &'c Catalog, progress: &Progress, now: i64) -> Result<()> {
        let rows = catalog.batches()?;
        self.totals.batches += rows.len();
        for row in &rows {
            if finished(row.state) {
                *self.ended.entry(row.role).or_default() += row.bytes.max(0);
            }
            self.totals.count(row);
        }
        let mut newest = rows.clone();
        newest.sort_by_key(|r| std::cmp::Reverse(r.updated_at));
        newest.truncate(20);
        self.newest.push(NewestRows {
            catalog,
            rows: newest,
        });
        for row in rows.into_iter().filter(|r| running(r.state)) {
            let last_moved = catalog.last_event(&row.batch_key)?;
            let batch = Batch::of(catalog, row, progress, now)?;
            let idle = now - last_moved.unwrap_or(batch.updated_us);
            self.stalled.extend(stalled(&batch, idle));
            self.in_flight.push(batch);
        }
        self.failures.extend(
            catalog
                .failures(None, 10)?
                .into_iter()
                .map(FailureView::from),
        );
        Ok(())
    }
}

/// The `newest` rows of every catalogue as batches: a running one is the one just read, with
/// its ETA; the others are read now.
fn recent(
    newest: Vec<NewestRows>,
    in_flight: &[Batch],
    progress: &Progress,
    now: i64,
) -> Result<Vec<Batch>> {
    let mut recent = vec![];
    for NewestRows { catalog, rows } in newest {
        for row in rows {
            let key = row.batch_key.to_string();
            match in_flight.iter().find(|b| b.key == key) {
                Some(batch) => recent.push(batch.clone()),
                None => recent.push(Batch::of(catalog, row, progress, now)?),
            }
        }
    }
    Ok(recent)
}
