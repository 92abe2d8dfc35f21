//! The front page in one answer: the batches in flight and lately changed, the newest failures,
//! alerts and totals, over every catalogue.

use std::collections::BTreeMap;

use anyhow::Result;
use forte_catalog::{BatchRow, BatchState, Catalog, Filter};
use serde::Serialize;

use super::alerts::{bottleneck, held_back, stalled};
use super::batch::finished;
use super::eta::EndedBytes;
use super::phase::{journeys, Journey, Phase};
use super::{running, Alert, Batch, FailureView, Progress, HOUR_US, RUNNING};
use crate::live::{QueueView, StageView, WireView};

/// The batches of the front page (on their way, changed in the last day, and the latest),
/// one per batch however many nodes recorded it, counted by where each is now ([`Phase`]),
/// and their bytes.
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
            count_ended(catalog, progress, &mut ended)?;
            rows.push(shown_rows(catalog, now)?);
            failures.extend(
                catalog
                    .failures(None, 10)?
                    .into_iter()
                    .map(FailureView::from),
            );
        }
        let rows = with_counterparts(catalogs, rows)?;
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

/// Adds to `ended` the bytes of `catalog`'s batches that ended done since `progress` began
/// counting, per role.
fn count_ended(catalog: &Catalog, progress: &Progress, ended: &mut EndedBytes) -> Result<()> {
    let counted = Filter {
        since: Some(progress.counted_from_us),
        ..Filter::default()
    };
    for c in catalog.batch_counts(&counted)? {
        if finished(c.state) {
            *ended.entry(c.role).or_default() += c.bytes.max(0);
        }
    }
    Ok(())
}

/// How many of the latest batches the front page lists, whatever their age.
const RECENT: usize = 20;

/// The rows the front page is made of, from one catalogue: the batches on their way (by
/// `batches_by_state`), those changed in the last day, and the latest [`RECENT`] whatever
/// their age (by `batches_by_updated`). Its totals are of these: history is `/history`'s.
fn shown_rows(catalog: &Catalog, now: i64) -> Result<Vec<BatchRow>> {
    let mut rows: BTreeMap<String, BatchRow> = BTreeMap::new();
    let day = Filter {
        since: Some(now - 24 * HOUR_US),
        ..Filter::default()
    };
    let latest = Filter {
        limit: Some(RECENT as i64),
        ..Filter::default()
    };
    let running = catalog.batches_in(&RUNNING)?;
    for row in running
        .into_iter()
        .chain(catalog.batches_matching(&day)?)
        .chain(catalog.batches_matching(&latest)?)
    {
        rows.insert(row.batch_key.to_string(), row);
    }
    Ok(rows.into_values().collect())
}

/// `rows` (per catalogue) with, from each other catalogue, the rows of the same batches (by
/// name, through `batches_by_name`, then by id): a batch's journey needs its rows on every
/// node, whichever of them changed lately.
fn with_counterparts(catalogs: &[Catalog], rows: Vec<Vec<BatchRow>>) -> Result<Vec<Vec<BatchRow>>> {
    if catalogs.len() < 2 {
        return Ok(rows);
    }
    let wanted: BTreeMap<String, std::collections::BTreeSet<String>> =
        rows.iter().flatten().fold(BTreeMap::new(), |mut m, r| {
            m.entry(r.name.clone())
                .or_default()
                .insert(r.batch_key.batch().to_owned());
            m
        });
    let mut out = vec![];
    for (catalog, mut mine) in catalogs.iter().zip(rows) {
        let have: std::collections::HashSet<String> =
            mine.iter().map(|r| r.batch_key.to_string()).collect();
        for (name, ids) in &wanted {
            let named = Filter {
                batch: Some(name.clone()),
                ..Filter::default()
            };
            let found = catalog.batches_matching(&named)?.into_iter().filter(|r| {
                ids.contains(r.batch_key.batch()) && !have.contains(&r.batch_key.to_string())
            });
            mine.extend(found);
        }
        out.push(mine);
    }
    Ok(out)
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
