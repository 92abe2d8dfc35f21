//! Stopping a daemon on SIGTERM or SIGINT. The first signal asks it to stop taking work and
//! finish what it has (each daemon decides what that is, and is given a grace period for it);
//! a second ends it at once, saying so. SIGHUP asks it to read again what it can reload (never
//! ends it).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

static STOP: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);
static RELOAD: AtomicBool = AtomicBool::new(false);
/// What a daemon ended early leaves to its next start, in words.
static LEFT: OnceLock<&'static str> = OnceLock::new();
/// The line a second signal prints, made before the handlers are installed: a handler may not
/// allocate or lock, only write(2) bytes made already.
static SECOND_SIGNAL_LINE: OnceLock<Vec<u8>> = OnceLock::new();

/// Installs the handlers: the first SIGTERM or SIGINT sets the flag [`stop_requested`] reads;
/// a second ends the process at once, with status 1, after a line saying so and what is `left`
/// to the next start. A daemon's command installs them before its start-up (a year-old
/// catalogue opens in seconds), so a stop asked for meanwhile is heeded once it is ready, not
/// by the signal's default (ended with no status); its role installs them again, harmlessly:
/// the first `left` stays.
pub fn install(left: &'static str) {
    extern "C" fn on_signal(signal: libc::c_int) {
        if STOP.swap(true, Ordering::SeqCst) {
            if let Some(line) = SECOND_SIGNAL_LINE.get() {
                // SAFETY: write(2) is async-signal-safe; the line lives for the whole process.
                unsafe { libc::write(libc::STDERR_FILENO, line.as_ptr().cast(), line.len()) };
            }
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(1) };
        }
        SIGNAL.store(signal, Ordering::SeqCst);
    }
    extern "C" fn on_hangup(_: libc::c_int) {
        RELOAD.store(true, Ordering::SeqCst);
    }
    LEFT.get_or_init(|| left);
    // Written from the signal handler, so made now, in the log's format (a JSON log's line
    // carries no time: the handler cannot read the clock safely; journald adds its own).
    SECOND_SIGNAL_LINE.get_or_init(|| {
        let said = format!("second signal: stopping at once; {left}");
        let line = match crate::logging::is_json() {
            true => serde_json::json!({"level": "WARN", "fields": {"message": said}, "target": "forte_daemon::signals"}).to_string(),
            false => said,
        };
        format!("{line}\n").into_bytes()
    });
    // SAFETY: the handlers only touch atomics (a set OnceLock's get is one), call write and
    // _exit, all async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, on_hangup as *const () as libc::sighandler_t);
    }
}

/// Whether a reload was asked for (SIGHUP) since the last call.
pub fn take_reload() -> bool {
    RELOAD.swap(false, Ordering::SeqCst)
}

/// Whether a stop was asked for.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// The signal that asked for the stop, by name.
pub fn which() -> &'static str {
    match SIGNAL.load(Ordering::SeqCst) {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => "a signal",
    }
}

/// Waits, in steps of `step`, until a stop is asked for.
pub fn wait_for_stop(step: Duration) {
    while !stop_requested() {
        std::thread::sleep(step);
    }
}

/// Sleeps `for_` or until a stop is asked for, whichever comes first.
pub fn sleep_unless_stopped(for_: Duration) {
    let until = std::time::Instant::now() + for_;
    while !stop_requested() {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// Once a stop is asked for, gives the daemon `grace` to finish, then ends it with status 0,
/// saying what is left to the next start (as told to [`install`], called first).
pub fn end_after_grace(grace: Duration) {
    let left = *LEFT.get().expect("signals::install runs first");
    std::thread::spawn(move || {
        wait_for_stop(Duration::from_millis(100));
        std::thread::sleep(grace);
        tracing::warn!(
            "the shutdown grace of {} s ran out: ending now; {left}",
            grace.as_secs_f64()
        );
        std::process::exit(0);
    });
}
