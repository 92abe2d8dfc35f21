//! How a daemon runs (`send` and `pull`): once or watching, how often it looks, how long a
//! stop waits, where failures are told, and where the dashboard is served.

use std::time::Duration;

use anyhow::Result;
use forte_catalog::Role;

use super::{http, Config, DaemonFlags, HttpServe};
use crate::failures::Failures;
use crate::retry::Retry;

/// A daemon's resolved running settings.
pub struct Daemon {
    /// Keep running (`--watch`) rather than one pass.
    pub watch: bool,
    /// Between looks for new work while watching.
    pub interval: Duration,
    /// How long batches under way may finish after SIGTERM or SIGINT.
    pub shutdown_grace: Duration,
    /// Where failures are reported.
    pub failures: Failures,
    /// Where the dashboard, JSON API and metrics are served, and to whom.
    pub http: Option<HttpServe>,
}

impl Daemon {
    /// Network failures are retried for ever by a daemon, once by a single pass.
    pub fn retry(&self) -> Retry {
        if self.watch {
            Retry::forever()
        } else {
            Retry::one_shot()
        }
    }
}

pub fn daemon(flags: &DaemonFlags, role: Role, config: &Config) -> Result<Daemon> {
    Ok(Daemon {
        watch: flags.watch,
        interval: Duration::from_secs(flags.interval),
        shutdown_grace: flags.shutdown_grace,
        failures: Failures::new(role, flags.on_failure.clone(), flags.on_failure_repeat),
        http: http(&flags.http, config, None)?,
    })
}
