//! What the `send` and `pull` daemons show of themselves on `--http ADDR`: the dashboard and
//! JSON API (`forte-view`, over the daemon's catalogue and the live view below) and Prometheus
//! metrics at `GET /metrics` (the relay serves its own on its HTTPS port too).
//!
//! Names: `forte_stage_*{role,stage}` for each pipeline stage (queue depth, bytes and items
//! through it, busy seconds, service rate), read from the running pipelines at each scrape,
//! so a queue shows how full it is now and busy time grows while an item is worked on;
//! `forte_queue_*{role}` for the work admitted and not finished,
//! `forte_batches_total{role,outcome}`, `forte_failures_total{role}`,
//! `forte_retries_total{role,operation}`, the settings the send tunes (`forte_tuned_uploads`, with
//! `forte_upload_goodput_bytes_per_second`, from `forte_edge::tuner`; `forte_zstd_level`), and with
//! `send --bwlimit` the limit in force, `forte_upload_limit_bytes_per_second{role="edge"}` (0:
//! none; set by `forte_relay::pace`).

mod counters;
mod etas;
mod relay;
mod stages;
mod tasks;
mod wire;

use anyhow::{Context, Result};
use forte_catalog::{BatchState, Catalog, Role};
use forte_view::{QueueView, StageView, WireView};
use metrics::counter;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::retry::Operation;
use crate::settings::HttpServe;

pub use counters::{batch_done, failure, queue, zstd_level};
pub use etas::publish_etas;
pub use relay::relay_view;
pub use stages::{item_latency, while_running};
pub use tasks::task_try;
pub use wire::{
    batch_ended, batch_probed, part_prepared, part_sending, part_sending_bytes, part_sent,
};

/// How the dashboard counts a daemon's progress: in parts of this size (files, at the core),
/// with batches in the order the queue's policy serves them.
pub struct Progress {
    pub part_size: u64,
    pub order: forte_view::model::Order,
}

/// Starts `role`'s daemon's dashboard, JSON API and metrics on `addr` (a thread of its own),
/// reading `catalog` through a handle of its own, with every metric family described and every
/// counter whose labels are known in advance present from the start, at 0: an alert on a
/// counter's rate needs the series before the first event. The pipeline stages' families are
/// read at each scrape (see [`stages::stage_families`]).
pub fn serve(http: HttpServe, role: Role, catalog: &Catalog, progress: Progress) -> Result<()> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .context("cannot record metrics")?;
    let view = forte_view::View {
        server: match role {
            Role::Edge => forte_view::Server::Edge,
            Role::Core => forte_view::Server::Core,
        },
        catalogs: vec![catalog.reader()],
        live: Some(Box::new(Daemon { handle })),
        progress: forte_view::model::Progress::new(progress.part_size, progress.order),
    };
    let bound = forte_view::start(http.addr, http.access, view)?;
    counters::describe();
    let outcomes: &[BatchState] = match role {
        Role::Edge => &[BatchState::Sent, BatchState::Failed],
        Role::Core => &[
            BatchState::Delivered,
            BatchState::Quarantined,
            BatchState::Failed,
        ],
    };
    for outcome in outcomes {
        let labels = [("role", role.as_str()), ("outcome", outcome.as_str())];
        counter!("forte_batches_total", &labels).absolute(0);
    }
    counter!("forte_failures_total", "role" => role.as_str()).absolute(0);
    for operation in Operation::ALL.into_iter().filter(|o| o.role() == role) {
        operation.retries().absolute(0);
    }
    queue(role, 0, 0, 0);
    tracing::info!("dashboard: http://{bound}/  metrics: http://{bound}/metrics");
    Ok(())
}

/// The edge's wire (its uploads as they go) for the dashboard's ETAs, or none.
pub fn wire_view() -> Option<WireView> {
    wire::view()
}

/// What a daemon shows of itself beside its catalogue: its stages and batch queue now, and
/// its metrics.
struct Daemon {
    handle: PrometheusHandle,
}

impl forte_view::Live for Daemon {
    fn stages(&self) -> Vec<StageView> {
        stages::running_views()
    }

    fn queue(&self) -> Option<QueueView> {
        *counters::QUEUE.lock()
    }

    fn metrics(&self) -> Option<String> {
        let mut text = self.handle.render();
        text.push_str(&stages::stage_families());
        text.push_str(&tasks::task_families());
        Some(text)
    }

    fn wire(&self) -> Option<WireView> {
        wire::view()
    }
}
