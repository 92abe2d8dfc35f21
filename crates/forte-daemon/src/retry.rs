//! Retrying transient failures with exponential backoff and jitter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use forte_catalog::{Role, Task};
use forte_relay::client::RelayError;

/// Retries of this process so far (the tuner counts them against a setting).
static RETRIES: AtomicU64 = AtomicU64::new(0);

pub fn retries_so_far() -> u64 {
    RETRIES.load(Ordering::Relaxed)
}

/// What a retried request does: the `operation` label of `forte_retries_total`, beside the role
/// whose requests they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// What the relay holds of objects (the edge asks before and beside sending).
    Status,
    Upload,
    /// Sealing an object or a batch.
    Seal,
    Cancel,
    /// The core's listing of what is ready.
    Listing,
    /// An inventory, a manifest or a part.
    Download,
    Acknowledge,
}

impl Operation {
    pub const ALL: [Operation; 7] = [
        Self::Status,
        Self::Upload,
        Self::Seal,
        Self::Cancel,
        Self::Listing,
        Self::Download,
        Self::Acknowledge,
    ];

    /// The counter of its requests tried again (`forte_retries_total`), which the monitor
    /// shows from 0 at start.
    pub fn retries(self) -> metrics::Counter {
        let labels = [("role", self.role().as_str()), ("operation", self.as_str())];
        metrics::counter!("forte_retries_total", &labels)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Status => "status",
            Self::Upload => "upload",
            Self::Seal => "seal",
            Self::Cancel => "cancel",
            Self::Listing => "listing",
            Self::Download => "download",
            Self::Acknowledge => "acknowledge",
        }
    }

    /// Whose requests these are.
    pub fn role(self) -> Role {
        match self {
            Self::Status | Self::Upload | Self::Seal | Self::Cancel => Role::Edge,
            Self::Listing | Self::Download | Self::Acknowledge => Role::Core,
        }
    }
}

impl From<Task> for Operation {
    fn from(task: Task) -> Self {
        match task {
            Task::Upload => Self::Upload,
            Task::Seal => Self::Seal,
            Task::Download => Self::Download,
        }
    }
}

/// How long to keep trying.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts before giving up; `None` retries forever (daemons).
    pub attempts: Option<u32>,
    pub first_delay: Duration,
    pub max_delay: Duration,
}

impl Retry {
    /// For one-shot commands: about two minutes of trying.
    pub fn one_shot() -> Self {
        Self {
            attempts: Some(8),
            first_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }

    /// For the downloads of one batch at the core: a few seconds of retries, then the batch
    /// fails and is tried again on its own schedule, so one object the relay cannot give never
    /// holds up the batches behind it.
    pub const WITHIN_A_BATCH: Self = Self {
        attempts: Some(4),
        first_delay: Duration::from_millis(500),
        max_delay: Duration::from_secs(4),
    };

    /// For daemons: never give up on a transient failure; back off to five minutes.
    pub fn forever() -> Self {
        Self {
            attempts: None,
            first_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(300),
        }
    }

    /// Runs `op` until it succeeds, fails for good (not transient), the attempts run out, or
    /// a stop is asked for (a signal: the wait between attempts ends with it).
    /// `what` names the request in the log line of each retry; each retry is counted under
    /// `operation`.
    pub fn run<T>(
        &self,
        operation: Operation,
        what: &str,
        op: impl FnMut() -> Result<T, RelayError>,
    ) -> Result<T, RelayError> {
        self.run_sleeping(operation, what, op, crate::signals::sleep_unless_stopped)
    }

    /// [`Retry::run`] with the wait between attempts done by `sleep` (tests record it).
    fn run_sleeping<T>(
        &self,
        operation: Operation,
        what: &str,
        mut op: impl FnMut() -> Result<T, RelayError>,
        mut sleep: impl FnMut(Duration),
    ) -> Result<T, RelayError> {
        let mut delay = self.first_delay;
        let mut attempt = 1;
        loop {
            match op() {
                Ok(v) => return Ok(v),
                Err(e) if !e.is_transient() => return Err(e),
                Err(e) if self.attempts.is_some_and(|n| attempt >= n) => return Err(e),
                // A daemon asked to stop does not wait for the relay to come back: what the
                // failure left is taken up at the next start, as after any stop.
                Err(e) if crate::signals::stop_requested() => return Err(e),
                Err(e) => {
                    let wait = jitter(delay);
                    operation.retries().increment(1);
                    RETRIES.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        "retrying {what} in {:.1} s (attempt {attempt}): {e}",
                        wait.as_secs_f64()
                    );
                    sleep(wait);
                    delay = next_delay(delay, self.max_delay);
                    attempt += 1;
                }
            }
        }
    }
}

/// The delay after `delay`: twice as long, but never longer than `max`.
fn next_delay(delay: Duration, max: Duration) -> Duration {
    (delay * 2).min(max)
}

/// Between half and all of `delay`, so that many workers failing together do not retry together.
fn jitter(delay: Duration) -> Duration {
    let mut byte = [0u8; 1];
    let _ = getrandom::getrandom(&mut byte);
    delay / 2 + delay.mul_f64(f64::from(byte[0]) / 255.0 / 2.0)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn quick(attempts: Option<u32>) -> Retry {
        Retry {
            attempts,
            first_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
        }
    }

    fn error(status: Option<u16>, permanent: bool) -> RelayError {
        RelayError {
            url: "https://relay/v1/ready".into(),
            status,
            message: "what went wrong".into(),
            permanent,
            held: None,
        }
    }

    /// How many times `retry` calls an operation that always fails with `e` (at most 20: a
    /// retry forever stops there, so that a wrong classification fails the test, not hangs it).
    fn calls(retry: Retry, e: impl Fn() -> RelayError) -> u32 {
        let n = Cell::new(0);
        let _ = retry.run(Operation::Upload, "a test", || {
            n.set(n.get() + 1);
            if n.get() == 20 {
                return Ok(());
            }
            Err(e())
        });
        n.get()
    }

    #[test]
    fn what_cannot_heal_is_tried_once_even_by_daemons() {
        for retry in [quick(Some(5)), quick(None)] {
            // A certificate that is not the pinned one, a URL that cannot work.
            assert_eq!(calls(retry, || error(None, true)), 1);
            // A refused token, a wrong role, a protocol error.
            for status in [401, 403, 400, 404, 422] {
                assert_eq!(calls(retry, || error(Some(status), false)), 1, "{status}");
            }
        }
    }

    #[test]
    fn what_can_heal_is_tried_until_the_attempts_run_out() {
        // No answer (refused, reset, timed out), a server error, a full relay, too many requests.
        assert_eq!(calls(quick(Some(4)), || error(None, false)), 4);
        for status in [500, 503, 507, 429, 408] {
            assert_eq!(
                calls(quick(Some(3)), || error(Some(status), false)),
                3,
                "{status}"
            );
        }
    }

    #[test]
    fn the_delay_doubles_up_to_the_cap_and_stays_there() {
        let max = Duration::from_secs(30);
        let mut delay = Duration::from_millis(500);
        let mut seen = vec![delay];
        for _ in 0..8 {
            delay = next_delay(delay, max);
            seen.push(delay);
        }
        let ms: Vec<u128> = seen.iter().map(Duration::as_millis).collect();
        assert_eq!(
            ms,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        // A first delay above the cap is cut to it at once.
        assert_eq!(next_delay(Duration::from_secs(40), max), max);
    }

    #[test]
    fn jitter_stays_between_half_and_all_of_the_delay_and_varies() {
        let delay = Duration::from_millis(1000);
        let mut distinct = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            let wait = jitter(delay);
            assert!(
                wait >= delay / 2 && wait <= delay,
                "{wait:?} outside [{:?}, {delay:?}]",
                delay / 2
            );
            distinct.insert(wait);
        }
        // Random, not a constant: 2000 draws of 256 possible values give far more than 10.
        assert!(
            distinct.len() > 10,
            "only {} distinct waits",
            distinct.len()
        );
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }

    /// The waits `retry` sleeps between the calls of an operation that always fails with `e`,
    /// and how many calls it made; nothing sleeps for real.
    fn waits(retry: Retry, e: impl Fn() -> RelayError) -> (u32, Vec<Duration>) {
        let n = Cell::new(0);
        let mut slept = Vec::new();
        let got: Result<(), _> = retry.run_sleeping(
            Operation::Upload,
            "a test",
            || {
                n.set(n.get() + 1);
                Err(e())
            },
            |d| slept.push(d),
        );
        assert!(got.is_err());
        (n.get(), slept)
    }

    #[test]
    fn one_shot_tries_eight_times_backing_off_with_jitter_to_the_cap() {
        let (calls, slept) = waits(Retry::one_shot(), || error(Some(503), false));
        assert_eq!(calls, 8, "one_shot gives up after 8 attempts");
        // A wait between each two attempts, none after the last.
        assert_eq!(slept.len(), 7, "{slept:?}");
        let nominal_ms = [500u64, 1000, 2000, 4000, 8000, 16000, 30000];
        for (wait, ms) in slept.iter().zip(nominal_ms) {
            let d = Duration::from_millis(ms);
            assert!(
                *wait >= d / 2 && *wait <= d,
                "wait {wait:?} not within [{:?}, {d:?}]: {slept:?}",
                d / 2
            );
        }
    }

    #[test]
    fn a_permanent_error_is_not_waited_for() {
        for retry in [Retry::one_shot(), Retry::forever()] {
            let (calls, slept) = waits(retry, || error(Some(401), false));
            assert_eq!((calls, slept.len()), (1, 0));
            let (calls, slept) = waits(retry, || error(None, true));
            assert_eq!((calls, slept.len()), (1, 0));
        }
    }

    #[test]
    fn a_transient_failure_then_success_succeeds() {
        let n = Cell::new(0);
        let got = quick(None).run(Operation::Upload, "a test", || {
            n.set(n.get() + 1);
            if n.get() < 3 {
                Err(error(Some(503), false))
            } else {
                Ok(n.get())
            }
        });
        assert_eq!(got.unwrap(), 3);
    }
}
