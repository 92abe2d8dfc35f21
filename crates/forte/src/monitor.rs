//! Prometheus metrics of the `send` and `pull` daemons, served at `GET /metrics` on the address
//! given with `--metrics` (the relay serves its own on its HTTPS port).
//!
//! Names: `forte_stage_*{role,stage}` for each pipeline stage (queue depth, bytes and items
//! through it, busy seconds, service rate), `forte_queue_*{role}` for the batch queue,
//! `forte_batches_total{role,outcome}`, `forte_failures_total{role}`,
//! `forte_retries_total`, the settings the send tunes (`forte_tuned_uploads`, with
//! `forte_upload_goodput_bytes_per_second`, from `edge::tuning`; `forte_zstd_level`), and with
//! `send --bwlimit` the limit in force, `forte_upload_limit_bytes_per_second{role="edge"}` (0:
//! none; set by `forte_relay::pace`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use forte_catalog::{BatchState, Role};
use forte_pipeline::Pipeline;
use metrics::{counter, gauge};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Starts the metrics endpoint on `addr` (its own thread and runtime).
pub fn serve(addr: SocketAddr) -> Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .with_context(|| format!("cannot serve metrics on {addr}"))?;
    println!("metrics: http://{addr}/metrics");
    Ok(())
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

pub fn retry() {
    counter!("forte_retries_total").increment(1);
}
