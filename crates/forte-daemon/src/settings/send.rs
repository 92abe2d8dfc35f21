//! Everything `send` runs with, resolved in one place: the relay, the edge's keys and prepare
//! pass, the uploads and their pacing, the queue policy, the site, the receipts that allow
//! deletion, the edge's tasks and how the daemon runs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use forte_catalog::Role;
use forte_format::TrustedCores;
use forte_relay::pace::Pacer;

use super::daemon::{daemon, Daemon};
use super::{
    edge, policy, receipt_pub, relay, tasks, upload_pacer, uploads, Config, DaemonFlags, EdgeFlags,
    EdgeSettings, EdgeSite, RelayFlags, RelayLink, ScheduleFlags, SendFlags, Uploads,
};
use crate::schedule::Policy;
use crate::tasks::{Point, Tasks};

/// `send`'s settings, resolved once.
pub struct SendSettings {
    /// The inbox: each subdirectory is one batch.
    pub inbox: PathBuf,
    pub relay: RelayLink,
    /// The keys and the prepare pass, whose sink is the upload gate.
    pub edge: EdgeSettings,
    /// Whether the tuner turns the uploads in flight (`--connections auto`).
    pub tune: bool,
    /// Holds the uploads to `--bwlimit` and `--target-rate`; none without a limit.
    pub pacer: Option<Arc<Pacer>>,
    pub policy: Policy,
    pub site: EdgeSite,
    /// The core keys whose receipts allow deletion; required by `delete_after_ack`.
    pub receipts: Option<TrustedCores>,
    pub delete_after_ack: bool,
    /// How long a batch without a marker must stay unchanged to be ready.
    pub settle: Duration,
    /// Batches to cancel instead of sending.
    pub cancel: Vec<String>,
    pub tasks: Tasks,
    pub daemon: Daemon,
}

/// The flag groups `send` parses.
pub struct SendCommand<'a> {
    pub inbox: &'a std::path::Path,
    pub send: &'a SendFlags,
    pub relay: &'a RelayFlags,
    pub edge: &'a EdgeFlags,
    pub schedule: &'a ScheduleFlags,
    pub daemon: &'a DaemonFlags,
}

pub fn send(flags: SendCommand, config: &Config) -> Result<SendSettings> {
    let f = flags.send;
    // Resolved in this order (after the inbox's lock, which `forte_edge::send::send` takes
    // first) so that the first mistake reported is the same as it always was.
    let relay = relay(flags.relay, config)?;
    let mut edge = edge(flags.edge, config)?;
    let Uploads { gate, tuned: tune } = uploads(f.connections, config);
    edge.prepare.sink = gate;
    let policy = policy(flags.schedule, config)?;
    let pacer = upload_pacer(f.bwlimit.as_deref(), f.target_rate.as_deref(), config)?;
    let daemon = daemon(flags.daemon, Role::Edge, config)?;
    let receipts = receipt_pub(&f.receipt_pub, config)?;
    if f.delete_after_ack && receipts.is_none() {
        bail!("--delete-after-ack needs the core's receipt key (--receipt-pub keys/receipt.pub, or keys.receipt_pub): without it, the relay's word alone would delete sources");
    }
    Ok(SendSettings {
        inbox: flags.inbox.to_path_buf(),
        relay,
        edge,
        tune,
        pacer,
        policy,
        site: EdgeSite::new(f.site.as_deref(), f.cancel.is_empty())?,
        receipts,
        delete_after_ack: f.delete_after_ack,
        settle: Duration::from_secs(f.settle),
        cancel: f.cancel.clone(),
        tasks: tasks(config, &[Point::Edge])?,
        daemon,
    })
}
