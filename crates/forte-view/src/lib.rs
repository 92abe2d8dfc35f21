//! What forte is doing, for people and programs: the versioned JSON API of docs/api.md and the
//! web dashboard built on it, served by `forte dashboard` over catalogues and by the daemons
//! (`send`, `pull`, `relay`) with `--http ADDR`.
//!
//! Modules: `model` (the answers, built from catalogue rows: progress, rate and ETA of a
//! batch, alerts), `live` (what a daemon adds: its stages and queue now, its metrics), `api`
//! (the JSON endpoints and the event stream), `pages` (the dashboard's HTML, rendered on the
//! server so that it reads without JavaScript; `assets/` holds its script and style, compiled
//! in), `access` (loopback, or a bearer token).
//!
//! The catalogue's API is blocking, so every read runs on tokio's blocking threads; each
//! daemon gives the view catalogue handles of its own (opened from the same URL), so a slow
//! page never holds the data path's writer.

mod access;
mod api;
pub mod live;
pub mod model;
mod pages;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::routing::get;
use axum::Router;
use forte_catalog::Catalog;

pub use access::Access;
pub use live::{
    BatchWire, HeldBatch, Live, QueueView, RelayHoldings, ShareView, SiteUsage, StageView,
    WaitingPart, WireView,
};

/// What serves the view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// `forte send --http`.
    Edge,
    /// `forte pull --http`.
    Core,
    /// `forte relay --http`.
    Relay,
    /// `forte dashboard`.
    Dashboard,
}

impl Server {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Edge => "edge",
            Self::Core => "core",
            Self::Relay => "relay",
            Self::Dashboard => "dashboard",
        }
    }
}

/// What the view reads.
pub struct View {
    pub server: Server,
    /// The catalogues it reads (the first is the node's own); none on a relay.
    pub catalogs: Vec<Catalog>,
    /// The daemon's live counters, if a daemon serves it.
    pub live: Option<Box<dyn Live>>,
    /// How progress is counted (the edge's part size) and rates estimated.
    pub progress: model::Progress,
}

impl View {
    fn stages(&self) -> Vec<StageView> {
        self.live.as_ref().map(|l| l.stages()).unwrap_or_default()
    }

    fn queue(&self) -> Option<QueueView> {
        self.live.as_ref().and_then(|l| l.queue())
    }

    fn wire(&self) -> Option<WireView> {
        self.live.as_ref().and_then(|l| l.wire())
    }
}

/// The API, the dashboard and `/metrics`, each request checked by `access`.
fn router(view: View, access: Access) -> Router {
    let view = Arc::new(view);
    Router::new()
        .merge(api::routes())
        .merge(pages::routes())
        .route("/metrics", get(api::metrics))
        .fallback(api::no_such_path)
        .layer(axum::middleware::from_fn_with_state(access, access::check))
        .with_state(view)
}

/// Binds `addr` now (so a taken port fails the command at once) and serves the view on a
/// thread of its own; returns the address bound.
pub fn start(addr: SocketAddr, access: Access, view: View) -> Result<SocketAddr> {
    let listener = bind(addr)?;
    let bound = listener.local_addr()?;
    let access = bound_to(access, bound);
    std::thread::Builder::new()
        .name("forte-http".into())
        .spawn(move || {
            if let Err(e) = serve(listener, access, view) {
                tracing::error!("the dashboard and API on {bound} stopped: {e:#}");
            }
        })
        .context("cannot start the HTTP thread")?;
    Ok(bound)
}

/// `access` for a server bound to `bound`, warning when that is reachable from other hosts.
fn bound_to(mut access: Access, bound: SocketAddr) -> Access {
    if !bound.ip().to_canonical().is_loopback() {
        let who = if access.token.is_some() {
            "hosts that send the token of --http-token-file"
        } else {
            "no other host (no --http-token-file), but it listens there"
        };
        tracing::warn!("the dashboard, API and metrics are served on {bound}, reachable beyond this machine: readable by this machine and {who}"
        );
    }
    access.bound = Some(bound);
    access
}

fn bind(addr: SocketAddr) -> Result<std::net::TcpListener> {
    std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .with_context(|| {
            format!("cannot serve HTTP on {addr} (in use? give another address to --http)")
        })
}

fn serve(listener: std::net::TcpListener, access: Access, view: View) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(8)
        .enable_all()
        .build()
        .context("cannot start the HTTP runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let app = router(view, access).into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, app).await?;
        Ok(())
    })
}
