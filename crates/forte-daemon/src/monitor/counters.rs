//! The families kept by the metrics crate's recorder: the batch queue, batches ended, failures,
//! the zstd level, and the help text of every family the send and pull daemons publish.

use forte_catalog::{BatchState, Role};
use forte_view::QueueView;
use metrics::{counter, describe_counter, describe_gauge, gauge, Unit};
use parking_lot::Mutex;

/// The `# HELP` text and unit of every family the send and pull daemons publish.
pub(super) fn describe() {
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

/// The batch queue as last published by [`queue`].
pub(super) static QUEUE: Mutex<Option<QueueView>> = Mutex::new(None);

/// The batch queue of `role`: batches in flight, files and bytes waiting.
pub fn queue(role: Role, batches: usize, files: usize, bytes: u64) {
    *QUEUE.lock() = Some(QueueView {
        role,
        batches,
        files,
        bytes,
    });
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

/// A failure was reported.
pub fn failure(role: Role) {
    counter!("forte_failures_total", "role" => role.as_str()).increment(1);
}
