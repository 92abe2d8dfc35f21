//! Retrying transient failures with exponential backoff and jitter.

use std::time::Duration;

use forte_relay::client::RelayError;

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

    /// For daemons: never give up on a transient failure; back off to five minutes.
    pub fn forever() -> Self {
        Self {
            attempts: None,
            first_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(300),
        }
    }

    /// Runs `op` until it succeeds, fails for good (not transient), or the attempts run out.
    /// `what` names the operation in the log line of each retry.
    pub fn run<T>(
        &self,
        what: &str,
        mut op: impl FnMut() -> Result<T, RelayError>,
    ) -> Result<T, RelayError> {
        let mut delay = self.first_delay;
        let mut attempt = 1;
        loop {
            match op() {
                Ok(v) => return Ok(v),
                Err(e) if !e.is_transient() => return Err(e),
                Err(e) if self.attempts.is_some_and(|n| attempt >= n) => return Err(e),
                Err(e) => {
                    let wait = jitter(delay);
                    crate::monitor::retry();
                    eprintln!(
                        "retrying {what} in {:.1} s (attempt {attempt}): {e}",
                        wait.as_secs_f64()
                    );
                    std::thread::sleep(wait);
                    delay = (delay * 2).min(self.max_delay);
                    attempt += 1;
                }
            }
        }
    }
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
        }
    }

    /// How many times `retry` calls an operation that always fails with `e` (at most 20: a
    /// retry forever stops there, so that a wrong classification fails the test, not hangs it).
    fn calls(retry: Retry, e: impl Fn() -> RelayError) -> u32 {
        let n = Cell::new(0);
        let _ = retry.run("a test", || {
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
    fn a_transient_failure_then_success_succeeds() {
        let n = Cell::new(0);
        let got = quick(None).run("a test", || {
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
