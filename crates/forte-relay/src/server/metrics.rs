//! The relay's Prometheus metrics: counters of what it stored, sealed, delivered and refused.
//!
//! The `metrics` facade records process-wide; the Prometheus recorder is installed once, by the
//! first relay started in the process, and renders on `GET /metrics`.

use std::sync::OnceLock;

use metrics::{counter, describe_counter, describe_gauge, gauge, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder, once per process, with every family described and every
/// counter whose labels are known in advance present from the start, at 0 (an alert on a
/// counter's rate needs the series before the first event).
pub fn install() {
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        // Fails only if another recorder was installed first; then metrics go there.
        let _ = metrics::set_global_recorder(recorder);
        describe();
        handle
    });
}

/// The relay's counters without labels: name, unit, help.
const COUNTERS: [(&str, Unit, &str); 9] = [
    (
        "forte_relay_parts_stored_total",
        Unit::Count,
        "Parts stored (their SHA-256 checked first)",
    ),
    (
        "forte_relay_part_bytes_total",
        Unit::Bytes,
        "Bytes of the parts stored",
    ),
    (
        "forte_relay_parts_already_held_total",
        Unit::Count,
        "Part uploads the relay held already (retries), not stored again",
    ),
    (
        "forte_relay_objects_sealed_total",
        Unit::Count,
        "Objects sealed",
    ),
    (
        "forte_relay_batches_sealed_total",
        Unit::Count,
        "Batches sealed",
    ),
    (
        "forte_relay_objects_acknowledged_total",
        Unit::Count,
        "Objects the core acknowledged as delivered, then deleted",
    ),
    (
        "forte_relay_parts_rejected_total",
        Unit::Count,
        "Parts the core reported damaged, dropped for the edge to send again",
    ),
    (
        "forte_relay_manifests_rejected_total",
        Unit::Count,
        "Manifests the core reported damaged, dropped for the edge to seal again",
    ),
    (
        "forte_relay_connections_refused_total",
        Unit::Count,
        "Connections closed as soon as accepted: over the relay's or one address's cap",
    ),
];

/// The gauges of what the store holds ([`held`]).
const HELD: [(&str, Unit, &str); 7] = [
    (
        "forte_relay_held_bytes",
        Unit::Bytes,
        "Bytes the store holds, all sites",
    ),
    (
        "forte_relay_quota_per_site_bytes",
        Unit::Bytes,
        "Most bytes one site may hold (0: no quota)",
    ),
    (
        "forte_relay_site_held_bytes",
        Unit::Bytes,
        "Bytes the store holds, by site",
    ),
    (
        "forte_relay_site_held_objects",
        Unit::Count,
        "Objects the store holds, not yet delivered, by site",
    ),
    (
        "forte_relay_site_sealed_batches",
        Unit::Count,
        "Batches sealed and waiting for the core, by site",
    ),
    (
        "forte_relay_site_oldest_held_seconds",
        Unit::Seconds,
        "Age of the oldest change among what a site holds",
    ),
    (
        "forte_relay_site_quota_used_ratio",
        Unit::Count,
        "A site's held bytes over its quota (0 to 1; 0 without a quota)",
    ),
];

/// The operations on a bucket, counted apart.
const BUCKET_OPERATIONS: [&str; 5] = ["put", "get", "head", "delete", "list"];

fn describe() {
    for (name, unit, help) in COUNTERS {
        describe_counter!(name, unit, help);
        counter!(name).absolute(0);
    }
    describe_counter!(
        "forte_relay_refused_total",
        Unit::Count,
        "Requests answered with an error, by HTTP status"
    );
    describe_counter!(
        "forte_relay_received_bytes_total",
        Unit::Bytes,
        "Request bytes received, by site"
    );
    describe_gauge!(
        "forte_relay_site_share_bytes_per_second",
        "The share of the relay's ingress each sending site is held to (0: none)"
    );
    describe_gauge!(
        "forte_relay_sites_sending",
        Unit::Count,
        "Sites sending now"
    );
    describe_counter!(
        "forte_relay_bucket_requests_total",
        Unit::Count,
        "Requests to the bucket store, by operation (a listing counts once)"
    );
    describe_counter!(
        "forte_relay_bucket_failures_total",
        Unit::Count,
        "Requests to the bucket store that failed"
    );
    for (name, unit, help) in HELD {
        describe_gauge!(name, unit, help);
    }
    describe_gauge!(
        "forte_upload_limit_bytes_per_second",
        "The upload limit in force (0: none)"
    );
}

/// Counts the bucket store's requests from the start, at 0 (only a relay on a bucket has them).
pub fn bucket_store() {
    for op in BUCKET_OPERATIONS {
        counter!("forte_relay_bucket_requests_total", "op" => op).absolute(0);
    }
    counter!("forte_relay_bucket_failures_total").absolute(0);
}

/// A connection closed at once, over a cap.
pub fn connection_refused() {
    counter!("forte_relay_connections_refused_total").increment(1);
}

/// What one site holds, as the store was last read ([`held`]).
pub struct SiteHeld<'a> {
    pub site: &'a str,
    pub bytes: u64,
    pub objects: usize,
    /// Batches sealed and waiting for the core.
    pub sealed_batches: usize,
    /// Seconds since the oldest change among what it holds.
    pub oldest_age_s: u64,
}

/// Sets the gauges of what the store holds per site, and the quota: read from the store when
/// the page or `/metrics` is asked for (the relay keeps no running count that survives its
/// restarts; the store is the truth). A site that holds nothing any more reads 0.
pub fn held(sites: &[SiteHeld], quota_per_site: Option<u64>, known: &[String]) {
    for site in known {
        let labels = [("site", site.clone())];
        gauge!("forte_relay_site_held_bytes", &labels).set(0.0);
        gauge!("forte_relay_site_held_objects", &labels).set(0.0);
        gauge!("forte_relay_site_sealed_batches", &labels).set(0.0);
        gauge!("forte_relay_site_oldest_held_seconds", &labels).set(0.0);
        gauge!("forte_relay_site_quota_used_ratio", &labels).set(0.0);
    }
    for s in sites {
        let labels = [("site", s.site.to_owned())];
        gauge!("forte_relay_site_held_bytes", &labels).set(s.bytes as f64);
        gauge!("forte_relay_site_held_objects", &labels).set(s.objects as f64);
        gauge!("forte_relay_site_sealed_batches", &labels).set(s.sealed_batches as f64);
        gauge!("forte_relay_site_oldest_held_seconds", &labels).set(s.oldest_age_s as f64);
        if let Some(quota) = quota_per_site {
            gauge!("forte_relay_site_quota_used_ratio", &labels).set(s.bytes as f64 / quota as f64);
        }
    }
    gauge!("forte_relay_held_bytes").set(sites.iter().map(|s| s.bytes as f64).sum::<f64>());
    gauge!("forte_relay_quota_per_site_bytes").set(quota_per_site.unwrap_or(0) as f64);
}

/// The metrics in Prometheus' text format.
pub fn render() -> String {
    HANDLE
        .get()
        .map(PrometheusHandle::render)
        .unwrap_or_default()
}
