//! `forte relay`: the HTTPS server in the DMZ.
//!
//! Which file holds which job:
//!
//! - `mod.rs`: how to run a relay ([`RelayConfig`]) and what its handlers share (`Relay`)
//! - `start.rs`: starting one: the store opened, the TLS identity chosen, abandoned uploads
//!   expired, the listener served in the background ([`start()`], [`RunningRelay`])
//! - `signals.rs`: the relay in the foreground ([`run`]): tokens reloaded on SIGHUP, a
//!   graceful shutdown on SIGTERM or SIGINT, an immediate one at a second signal
//! - `routes.rs`: which handler answers which path, and the largest body each reads
//! - `gate.rs`: what every request passes before its handler: its token, its body's size
//!   and memory, its site's share of the ingress
//! - `answer.rs`: error answers ([`store::StoreError`] as HTTP), and store work run off the
//!   async workers
//! - `request.rs`: who a request is from and the values its path and headers give, checked
//! - `objects.rs`: the edge's objects: parts, one-part objects, seals, statuses
//! - `batches.rs`: the edge's batches: seals (waiting for members on the way), cancelling,
//!   receipts, and the site its token belongs to
//! - `pull.rs`: the core: ready listings, inventories, manifests, parts, acknowledgements,
//!   rejections, metrics
//! - `auth.rs` (tokens), `body.rs` (streamed bodies), `connections.rs` (connection caps),
//!   `memory.rs` (memory for bodies held whole), `share.rs` (sites' fair shares),
//!   `metrics.rs` (Prometheus), `site_metrics.rs` (the metrics a core token limited to some
//!   sites sees), `store/` (what the relay keeps)

mod answer;
mod auth;
mod batches;
mod body;
pub mod connections;
mod gate;
mod memory;
mod metrics;
pub use memory::DEFAULT_BUDGET as DEFAULT_BODY_MEMORY;
/// The relay's metrics in Prometheus' text format, every site's (what `GET /metrics` answers a
/// core token of all sites).
pub use metrics::render as metrics_text;
pub use metrics::{held as set_held_gauges, SiteHeld};
mod objects;
mod pull;
mod request;
mod routes;
pub mod share;
mod signals;
mod site_metrics;
mod start;
pub mod store;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use answer::{internal_error, Answer, Failure};
pub use auth::{new_entry as new_token_entry, Principal, Tokens};
use share::Shares;
pub use signals::run;
pub use start::{start, RunningRelay};
use store::{Location, Store};

/// How to run a relay.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub listen: SocketAddr,
    /// Where objects and the relay's records live: a directory, or a bucket that several
    /// relays may share.
    pub store: Location,
    pub tokens: PathBuf,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Host names and addresses for a self-signed certificate.
    pub tls_names: Vec<String>,
    /// Most bytes one site may hold at the relay.
    pub quota_per_site: Option<u64>,
    /// Open objects (uploads never sealed) unchanged this long are deleted: an edge abandoned
    /// them. Checked at start and then every tenth of this time (at most hourly).
    pub expire_open_after: Option<std::time::Duration>,
    /// Hold sites sending at once to fair shares of the ingress ([`share`]); without, they
    /// split it as TCP does, per connection.
    pub fair_shares: bool,
    /// How long requests in flight may take to finish after SIGTERM or SIGINT.
    pub shutdown_grace: std::time::Duration,
    /// How many connections it holds, and for how long.
    pub connections: connections::Limits,
    /// Bytes of request bodies held whole in memory at once, all requests together
    /// ([`memory`]).
    pub body_memory: u64,
}

struct Relay {
    store: Store,
    /// Replaced whole when tokens.toml is reloaded (SIGHUP); a request reads it once.
    tokens: parking_lot::RwLock<Arc<Tokens>>,
    /// Counts seals of objects and batches per site: what a long poll of `GET /v1/ready`
    /// waits on.
    seals: tokio::sync::watch::Sender<Seals>,
    /// Each sending site's share of the ingress, paced as its uploads' bodies are read.
    shares: Arc<Shares>,
    /// The memory request bodies held whole may take together.
    bodies: memory::BodyMemory,
    /// How long a request's body may pause before it is given up (the idle timeout).
    body_stall: std::time::Duration,
    /// The connections it holds: the gate vouches for the address of a request with a valid
    /// token, whose connections a flood of others cannot then close.
    connections: connections::CappedAcceptor,
}

impl Relay {
    /// Counts a seal of `site`'s and wakes every long poll waiting for one.
    fn sealed_something(&self, site: &str) {
        self.seals
            .send_modify(|seals| *seals.by_site.entry(site.to_owned()).or_default() += 1);
    }
}

/// The seals (objects and batches) the relay has taken since it started, by site.
#[derive(Default)]
struct Seals {
    by_site: std::collections::HashMap<String, u64>,
}

impl Seals {
    /// The seal generation `core` is told: the seals of the sites it pulls only, so that another
    /// site's seals neither show in its count nor end its long poll.
    fn generation(&self, core: &Principal) -> u64 {
        self.by_site
            .iter()
            .filter(|(site, _)| core.pulls(site))
            .map(|(_, n)| n)
            .sum()
    }
}
