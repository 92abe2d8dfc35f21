//! The relay's Prometheus metrics: counters of what it stored, sealed, delivered and refused.
//!
//! The `metrics` facade records process-wide; the Prometheus recorder is installed once, by the
//! first relay started in the process, and renders on `GET /metrics`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder, once per process.
pub fn install() {
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        // Fails only if another recorder was installed first; then metrics go there.
        let _ = metrics::set_global_recorder(recorder);
        handle
    });
}

/// The metrics in Prometheus' text format.
pub fn render() -> String {
    HANDLE
        .get()
        .map(PrometheusHandle::render)
        .unwrap_or_default()
}
