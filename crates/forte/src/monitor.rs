//! Prometheus metrics of the `send` and `pull` daemons, served at `GET /metrics` on the address
//! given with `--metrics` (the relay serves its own on its HTTPS port).
//!
//! Names: `forte_stage_*{role,stage}` for each pipeline stage (queue depth, bytes and items
//! through it, busy seconds, service rate), `forte_queue_*{role}` for the batch queue,
//! `forte_batches_total{role,outcome}`, `forte_failures_total{role}`,
//! `forte_retries_total{role,operation}`, the settings the send tunes (`forte_tuned_uploads`, with
//! `forte_upload_goodput_bytes_per_second`, from `edge::tuning`; `forte_zstd_level`), and with
//! `send --bwlimit` the limit in force, `forte_upload_limit_bytes_per_second{role="edge"}` (0:
//! none; set by `forte_relay::pace`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use forte_catalog::{BatchState, Role};
use forte_pipeline::Pipeline;

use crate::transfer::retry::Operation;
use metrics::{counter, describe_counter, describe_gauge, gauge, Unit};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Starts the metrics endpoint of `role`'s daemon on `addr` (its own thread and runtime), with
/// every family described and every counter whose labels are known in advance present from
/// the start, at 0: an alert on a counter's rate needs the series before the first event.
/// (The stage families appear when the first pass starts its stages.)
pub fn serve(addr: SocketAddr, role: Role) -> Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .with_context(|| format!("cannot serve metrics on {addr}"))?;
    describe();
    let outcomes = match role {
        Role::Edge => [BatchState::Sent, BatchState::Failed],
        Role::Core => [BatchState::Delivered, BatchState::Failed],
    };
    for outcome in outcomes {
        let labels = [("role", role.as_str()), ("outcome", outcome.as_str())];
        counter!("forte_batches_total", &labels).absolute(0);
    }
    counter!("forte_failures_total", "role" => role.as_str()).absolute(0);
    for operation in Operation::ALL.into_iter().filter(|o| o.role() == role) {
        retries(operation).absolute(0);
    }
    queue(role, 0, 0, 0);
    println!("metrics: http://{addr}/metrics");
    Ok(())
}

/// The `# HELP` text and unit of every family the send and pull daemons publish.
fn describe() {
    describe_gauge!(
        "forte_stage_queue_depth",
        Unit::Count,
        "Items waiting in a pipeline stage's input queue"
    );
    describe_gauge!(
        "forte_stage_service_rate_bytes_per_second",
        "Input bytes a stage handles per busy second of one worker"
    );
    describe_counter!(
        "forte_stage_items_total",
        Unit::Count,
        "Items (files or parts) that entered a pipeline stage"
    );
    describe_counter!(
        "forte_stage_bytes_in_total",
        Unit::Bytes,
        "Bytes that entered a pipeline stage"
    );
    describe_counter!(
        "forte_stage_bytes_out_total",
        Unit::Bytes,
        "Bytes a pipeline stage passed on"
    );
    describe_counter!(
        "forte_stage_busy_milliseconds_total",
        Unit::Milliseconds,
        "Time a stage's workers spent on items, summed over workers"
    );
    describe_gauge!(
        "forte_queue_batches",
        Unit::Count,
        "Batches admitted and not finished"
    );
    describe_gauge!(
        "forte_queue_files",
        Unit::Count,
        "Files of admitted batches not finished"
    );
    describe_gauge!(
        "forte_queue_bytes",
        Unit::Bytes,
        "Bytes of admitted batches not finished"
    );
    describe_counter!(
        "forte_batches_total",
        Unit::Count,
        "Batches that ended, by outcome"
    );
    describe_counter!(
        "forte_failures_total",
        Unit::Count,
        "Failures reported (each also a failure event in the catalogue and the log)"
    );
    describe_counter!(
        "forte_retries_total",
        Unit::Count,
        "Requests to the relay tried again after a transient failure, by operation"
    );
    describe_gauge!(
        "forte_tuned_uploads",
        Unit::Count,
        "Uploads in flight the sender's tuner chose"
    );
    describe_gauge!(
        "forte_upload_goodput_bytes_per_second",
        "Sealed bytes the relay acknowledged per second, as the tuner measured them"
    );
    describe_gauge!(
        "forte_upload_limit_bytes_per_second",
        "The upload limit in force (--bwlimit or the relay's share; 0: none)"
    );
    describe_gauge!(
        "forte_zstd_level",
        Unit::Count,
        "The zstd level parts are compressed at now"
    );
}

/// Runs `work` while a thread publishes `pipeline`'s stage counters once a second (and once
/// more at the end), plus whatever `also` publishes.
pub fn while_running<R>(
    role: Role,
    pipeline: &Pipeline,
    also: impl Fn() + Sync,
    work: impl FnOnce() -> R,
) -> R {
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let also = &also;
        s.spawn(move || {
            // A pipeline's counters start at zero with each pass; the exported counters go on
            // from where the last pass left them.
            let mut seen: HashMap<&'static str, [u64; 4]> = HashMap::new();
            loop {
                let last = finished.recv_timeout(Duration::from_secs(1))
                    != Err(std::sync::mpsc::RecvTimeoutError::Timeout);
                for st in pipeline.snapshot() {
                    let labels = [("role", role.as_str()), ("stage", st.name)];
                    gauge!("forte_stage_queue_depth", &labels).set(st.queue_depth as f64);
                    gauge!("forte_stage_service_rate_bytes_per_second", &labels)
                        .set(st.service_rate_bytes_per_sec);
                    let now = [
                        st.items_in,
                        st.bytes_in,
                        st.bytes_out,
                        (st.busy_seconds * 1e3) as u64,
                    ];
                    let before = seen.insert(st.name, now).unwrap_or_default();
                    let delta = |i: usize| now[i].saturating_sub(before[i]);
                    counter!("forte_stage_items_total", &labels).increment(delta(0));
                    counter!("forte_stage_bytes_in_total", &labels).increment(delta(1));
                    counter!("forte_stage_bytes_out_total", &labels).increment(delta(2));
                    counter!("forte_stage_busy_milliseconds_total", &labels).increment(delta(3));
                }
                also();
                if last {
                    break;
                }
            }
        });
        let result = work();
        drop(done);
        result
    })
}

/// The batch queue of `role`: batches in flight, files and bytes waiting.
pub fn queue(role: Role, batches: usize, files: usize, bytes: u64) {
    let role = role.as_str();
    gauge!("forte_queue_batches", "role" => role).set(batches as f64);
    gauge!("forte_queue_files", "role" => role).set(files as f64);
    gauge!("forte_queue_bytes", "role" => role).set(bytes as f64);
}

/// The zstd level parts are compressed at now (`--level auto` turns it).
pub fn zstd_level(level: i32) {
    gauge!("forte_zstd_level", "role" => "edge").set(f64::from(level));
}

/// A batch ended: `outcome` is `sent`, `delivered` or `failed`.
pub fn batch_done(role: Role, outcome: BatchState) {
    counter!("forte_batches_total", "role" => role.as_str(), "outcome" => outcome.as_str())
        .increment(1);
}

pub fn failure(role: Role) {
    counter!("forte_failures_total", "role" => role.as_str()).increment(1);
}

/// A request of `operation` is tried again.
pub fn retry(operation: Operation) {
    retries(operation).increment(1);
}

fn retries(operation: Operation) -> metrics::Counter {
    let role = operation.role().as_str();
    let labels = [("role", role), ("operation", operation.as_str())];
    counter!("forte_retries_total", &labels)
}
