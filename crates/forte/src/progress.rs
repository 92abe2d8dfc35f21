//! Progress bars on a terminal, silence elsewhere.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Runs `work` while a byte progress bar on stderr shows what `poll` reports: bytes done and a
/// message. The bar is drawn only when stderr is a terminal and `quiet` is off.
pub fn with_progress<R>(
    total: u64,
    quiet: bool,
    poll: impl Fn() -> (u64, String) + Sync,
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
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let (pos, msg) = poll();
                bar.set_position(pos);
                bar.set_message(msg);
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let result = work();
        done.store(true, Ordering::Relaxed);
        bar.finish_and_clear();
        result
    })
}
