//! The front page in one answer: the batches in flight and lately changed, the newest failures,
//! alerts and totals, over every catalogue.

use anyhow::Result;
use forte_catalog::{BatchState, Catalog};
use serde::Serialize;

use super::alerts::{bottleneck, held_back, stalled};
use super::batch::finished;
use super::eta::EndedBytes;
use super::phase::{journeys, Journey, Phase};
use super::{running, Alert, Batch, FailureView, Progress};
use crate::live::{QueueView, StageView, WireView};

/// The batches the catalogues hold, one per batch however many nodes recorded it, counted by
/// where each is now ([`Phase`]), and their bytes.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Totals {
    pub batches: usize,
    /// Ready at an edge or going up to the relay.
    pub at_edge: usize,
    /// Sealed at the relay, waiting for the core.
    pub at_relay: usize,
    /// Being pulled or checked at the core.
    pub at_core: usize,
    pub delivered: usize,
    /// Failed, quarantined or stopped: each needs a look.
    pub held_back: usize,
    pub bytes: i64,
}

/// The front page in one answer: `GET /api/v1/overview`, and each server-sent event.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub at_us: i64,
    /// The batches on their way, one each (its row in charge, with its phase).
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
        let mut ended = EndedBytes::default();
        let mut failures = vec![];
        let mut rows = vec![];
        for catalog in catalogs {
            let mine = catalog.batches()?;
            for row in mine.iter().filter(|r| finished(r.state)) {
                *ended.entry(row.role).or_default() += row.bytes.max(0);
            }
            rows.push(mine);
            failures.extend(
                catalog
                    .failures(None, 10)?
                    .into_iter()
                    .map(FailureView::from),
            );
        }
        let journeys = journeys(catalogs, rows)?;
        // Every running row of every node, whose ETAs are worked out together (a node serves
        // its batches in an order), and the alerts of those that stopped moving.
        let mut running_rows = vec![];
        let mut alerts = vec![];
        for journey in journeys.values() {
            for (catalog, row) in journey.rows().filter(|(_, r)| running(r.state)) {
                let last_moved = catalog.last_event(&row.batch_key)?;
                let batch = Batch::of(catalog, row.clone(), progress, now)?;
                let idle = now - last_moved.unwrap_or(batch.updated_us);
                alerts.extend(stalled(&batch, idle));
                running_rows.push(batch);
            }
        }
        progress.queue_etas(&mut running_rows, &ended, wire.as_ref(), now);
        for catalog in catalogs {
            progress.show_published(catalog, &mut running_rows, now)?;
        }
        let totals = Totals::of(journeys.values());
        let mut in_flight = vec![];
        let mut newest: Vec<&Journey> = journeys.values().collect();
        newest.sort_by_key(|j| std::cmp::Reverse(j.updated()));
        let mut recent = vec![];
        for journey in journeys.values() {
            if !journey.phase().ended() {
                in_flight.push(shown(journey, &running_rows, progress, now)?);
            }
        }
        for journey in newest.into_iter().take(20) {
            recent.push(shown(journey, &running_rows, progress, now)?);
        }
        alerts.extend(recent.iter().filter_map(|b| held_back(b, now)));
        alerts.extend(bottleneck(&stages));
        // Those under way first, in the order they began; then the waiting, as they arrived.
        in_flight.sort_by_key(|b| {
            (
                !b.running,
                b.state == BatchState::Queued,
                b.started_us,
                b.arrived_us,
            )
        });
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

/// The batch of `journey` as the overview shows it: its row in charge (the one just read with
/// its ETA if it runs), with the journey's phase and site.
fn shown(
    journey: &Journey,
    running_rows: &[Batch],
    progress: &Progress,
    now: i64,
) -> Result<Batch> {
    let (catalog, row) = journey.in_charge();
    let key = row.batch_key.to_string();
    let mut batch = match running_rows.iter().find(|b| b.key == key) {
        Some(batch) => batch.clone(),
        None => Batch::of(catalog, row.clone(), progress, now)?,
    };
    batch.phase = journey.phase();
    batch.catalog = journey.catalog_index();
    if batch.site.is_empty() {
        batch.site = journey.site.clone();
    }
    batch.receipted = journey.receipted;
    Ok(batch)
}

impl Totals {
    fn of<'a, 'c: 'a>(journeys: impl Iterator<Item = &'a Journey<'c>>) -> Self {
        let mut totals = Self::default();
        for journey in journeys {
            totals.batches += 1;
            let count = match journey.phase() {
                Phase::AtEdge | Phase::Sending => &mut totals.at_edge,
                Phase::AtRelay => &mut totals.at_relay,
                Phase::Pulling | Phase::Checking => &mut totals.at_core,
                Phase::Delivered => &mut totals.delivered,
                Phase::Quarantined | Phase::Failed | Phase::Stopped => &mut totals.held_back,
            };
            *count += 1;
            // The edge's row counts raw bytes; the core's, sealed bytes on the wire.
            let (_, row) = journey.edge.as_ref().unwrap_or_else(|| journey.in_charge());
            totals.bytes += row.bytes.max(0);
        }
        totals
    }
}
