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

/// Runs a prepare pass (`run`) with a progress bar: bytes, rate, ratio, files.
pub fn prepare_with_progress<R>(
    prepare: &Prepare,
    file_count: usize,
    total: u64,
    quiet: bool,
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
            Shown {
                bytes: raw,
                message: format!("ratio {r:.2} · files {files}/{file_count}"),
            }
        },
        run,
    )
}
