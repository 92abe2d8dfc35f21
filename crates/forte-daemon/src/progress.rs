//! Progress bars on a terminal, silence elsewhere.

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use std::sync::atomic::Ordering;

use forte_prepare::Prepare;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::units::ratio;

/// What a progress bar shows at one look.
pub struct Shown {
    /// Bytes done, of the bar's total.
    pub bytes: u64,
    /// The message beside the bar.
    pub message: String,
}

/// Runs `work` while a byte progress bar on stderr shows what `poll` reports: bytes done and a
/// message. The bar is drawn only when stderr is a terminal and `quiet` is off.
pub fn with_progress<R>(
    total: u64,
    quiet: bool,
    poll: impl Fn() -> Shown + Sync,
    work: impl FnOnce() -> R,
) -> R {
    let target = if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {elapsed_precise} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    // Dropping the sender ends the ticker at once, not at its next tick.
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let (poll, bar) = (&poll, &bar);
        s.spawn(move || loop {
            let Shown { bytes, message } = poll();
            bar.set_position(bytes);
            bar.set_message(message);
            if finished.recv_timeout(Duration::from_millis(200)) != Err(RecvTimeoutError::Timeout) {
                break;
            }
        });
        let result = work();
        drop(done);
        bar.finish_and_clear();
        result
    })
}

/// Runs a prepare pass (`run`) with a progress bar: bytes, rate, ratio, files, and with
/// `eta` the time left as the dashboard tells it (`DashboardEta`).
pub fn prepare_with_progress<R>(
    prepare: &Prepare,
    file_count: usize,
    total: u64,
    quiet: bool,
    eta: Option<&DashboardEta>,
    run: impl FnOnce() -> R,
) -> R {
    with_progress(
        total,
        quiet,
        || {
            let t = &prepare.totals;
            let raw = t.raw_bytes.load(Ordering::Relaxed);
            let files =
                t.files_done.load(Ordering::Relaxed) + t.files_failed.load(Ordering::Relaxed);
            let r = ratio(raw, t.compressed_bytes.load(Ordering::Relaxed));
            let left = eta
                .and_then(DashboardEta::seconds)
                .map(|s| format!(" · ETA {}", crate::units::duration_text(s)))
                .unwrap_or_default();
            Shown {
                bytes: raw,
                message: format!("ratio {r:.2} · files {files}/{file_count}{left}"),
            }
        },
        run,
    )
}

/// The time until every running batch of this node is done, worked out as the dashboard
/// works out its ETAs (`forte_view::model`: the node's rate over the last 30 s and the bytes
/// still to leave, in the order its policy serves the batches), from the same catalogue and
/// live view; read at most once a second.
pub struct DashboardEta<'a> {
    catalog: &'a forte_catalog::Catalog,
    role: forte_catalog::Role,
    progress: forte_view::model::Progress,
    last: parking_lot::Mutex<Option<(std::time::Instant, Option<f64>)>>,
}

impl<'a> DashboardEta<'a> {
    pub fn new(
        catalog: &'a forte_catalog::Catalog,
        role: forte_catalog::Role,
        part_size: u64,
        order: forte_view::model::Order,
    ) -> Self {
        Self {
            catalog,
            role,
            progress: forte_view::model::Progress::new(part_size, order),
            last: parking_lot::Mutex::new(None),
        }
    }

    /// Seconds left, if the rate can be told yet.
    pub fn seconds(&self) -> Option<f64> {
        let mut last = self.last.lock();
        match *last {
            Some((at, eta)) if at.elapsed() < Duration::from_secs(1) => eta,
            _ => {
                let eta = self.read();
                *last = Some((std::time::Instant::now(), eta));
                eta
            }
        }
    }

    fn read(&self) -> Option<f64> {
        let overview = forte_view::model::Overview::read(
            std::slice::from_ref(self.catalog),
            vec![],
            None,
            crate::monitor::wire_view(),
            &self.progress,
        )
        .ok()?;
        overview
            .in_flight
            .iter()
            .filter(|b| b.role == self.role)
            .filter_map(|b| b.eta_s)
            .reduce(f64::max)
    }
}
