//! What every forte daemon shares, whatever its role: the settings resolved once at a
//! command's start, the catalogue recording, the monitor (dashboard and metrics), the failure
//! hook, the site's tasks, the queue policy, retries, signals, units and progress bars.
//! The roles themselves are forte-edge and forte-core; the relay is forte-relay.

pub mod failures;
pub mod logging;
pub mod monitor;
pub mod progress;
pub mod record;
pub mod retry;
pub mod schedule;
pub mod settings;
pub mod signals;
pub mod tasks;
pub mod units;
