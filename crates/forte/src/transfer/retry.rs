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
