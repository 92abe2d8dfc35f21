//! Starting a relay: its store opened (acknowledgements a stop interrupted finished), its TLS
//! identity chosen (kept in a shared bucket, or files, or self-signed), abandoned uploads
//! expired at start and then periodically, and the listener served on a runtime of its own in
//! a background thread ([`RunningRelay`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

use super::routes::router;
use super::{connections, memory, metrics, Location, Relay, RelayConfig, Shares, Store, Tokens};
use crate::tls::{server_identity, ServerIdentity};

/// A relay running on a background runtime (for tests and `forte demo`).
pub struct RunningRelay {
    pub addr: SocketAddr,
    pub fingerprint: String,
    pub cert_path: PathBuf,
    handle: axum_server::Handle<SocketAddr>,
    thread: Option<std::thread::JoinHandle<()>>,
    relay: Arc<Relay>,
    tokens_path: PathBuf,
}

impl RunningRelay {
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Reads the tokens file again and puts it in force for every request from now on; one
    /// that does not read or parse is refused, and the tokens in force stay. Requests in
    /// flight are not touched. Returns how many tokens are in force.
    pub fn reload_tokens(&self) -> Result<usize> {
        let tokens = Tokens::load(&self.tokens_path)?;
        let count = tokens.count();
        *self.relay.tokens.write() = Arc::new(tokens);
        Ok(count)
    }

    /// Stops taking connections and ends once the requests in flight are answered, or after
    /// `grace`, whichever comes first.
    pub fn shut_down(mut self, grace: std::time::Duration) {
        self.handle.graceful_shutdown(Some(grace));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RunningRelay {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Binds, then serves on a runtime of its own in a background thread.
pub fn start(config: RelayConfig) -> Result<RunningRelay> {
    let Prepared { relay, identity } = prepare(&config)?;
    let kept = relay.clone();
    let limits = config.connections;
    let listener = std::net::TcpListener::bind(config.listen)
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let handle = axum_server::Handle::new();
    let server_handle = handle.clone();
    let tls = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(identity.config));
    let thread = std::thread::Builder::new()
        .name("forte-relay".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            runtime.block_on(async move {
                let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(tls)
                    .handshake_timeout(limits.handshake)
                    .acceptor(relay.connections.clone());
                // HTTP/1.1 only (the relay offers no ALPN): an auto-detecting server first
                // waits, without a timeout, for a request's first bytes to tell the version.
                let mut server = axum_server::from_tcp(listener)
                    .expect("a bound listener")
                    .acceptor(acceptor)
                    .http1_only()
                    .handle(server_handle);
                server
                    .http_builder()
                    .http1()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(limits.idle);
                // Each request carries its peer's address, which the gate vouches for.
                let service = router(relay).into_make_service_with_connect_info::<SocketAddr>();
                if let Err(e) = server.serve(service).await {
                    tracing::error!("relay stopped: {e}");
                }
            });
        })?;
    Ok(RunningRelay {
        addr,
        fingerprint: identity.fingerprint,
        cert_path: identity.cert_path,
        handle,
        thread: Some(thread),
        relay: kept,
        tokens_path: config.tokens.clone(),
    })
}

/// A relay ready to serve, and the TLS identity it presents.
struct Prepared {
    relay: Arc<Relay>,
    identity: ServerIdentity,
}

fn prepare(config: &RelayConfig) -> Result<Prepared> {
    config.connections.fit_descriptors()?;
    metrics::install();
    if matches!(config.store, Location::Bucket { .. }) {
        metrics::bucket_store();
    }
    let tokens = parking_lot::RwLock::new(Arc::new(Tokens::load(&config.tokens)?));
    let store = Store::open(config.store.clone(), config.quota_per_site)?;
    if let Some(age) = config.expire_open_after {
        expire_open(&store, age);
    }
    let identity = identity_for(config, &store)?;
    let relay = Arc::new(Relay {
        store,
        tokens,
        seals: tokio::sync::watch::channel(Default::default()).0,
        shares: Arc::new(Shares::new(config.fair_shares)),
        bodies: memory::BodyMemory::new(config.body_memory),
        body_stall: config.connections.idle,
        connections: connections::CappedAcceptor::new(config.connections),
    });
    if let Some(age) = config.expire_open_after {
        expire_periodically(&relay, age)?;
    }
    Ok(Prepared { relay, identity })
}

/// The TLS identity the relay presents: the certificate and key it was given, or a
/// self-signed one, kept in the store's directory or, for relays sharing a bucket, in the
/// bucket, so that they all present one certificate.
fn identity_for(config: &RelayConfig, store: &Store) -> Result<ServerIdentity> {
    let self_signed = config.tls_cert.is_none() && config.tls_key.is_none();
    Ok(match &config.store {
        // Relays sharing a bucket present one certificate, kept in the bucket.
        Location::Bucket { .. } if self_signed => {
            let pem = store.shared_identity(|| crate::tls::self_signed_pem(&config.tls_names))?;
            crate::tls::identity_from_pem(&pem)?
        }
        Location::Bucket { .. } => server_identity(
            config.tls_cert.as_deref(),
            config.tls_key.as_deref(),
            std::path::Path::new(""),
            &config.tls_names,
        )?,
        Location::Dir(dir) => server_identity(
            config.tls_cert.as_deref(),
            config.tls_key.as_deref(),
            &dir.join("tls"),
            &config.tls_names,
        )?,
    })
}

/// Expires uploads abandoned for `age` every tenth of it (at least every hour, at most every
/// second), in a thread of its own, for as long as the relay lives.
fn expire_periodically(relay: &Arc<Relay>, age: std::time::Duration) -> Result<()> {
    let weak = Arc::downgrade(relay);
    let every = (age / 10).clamp(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(3600),
    );
    std::thread::Builder::new()
        .name("forte-relay-expiry".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            let Some(relay) = weak.upgrade() else { return };
            expire_open(&relay.store, age);
        })?;
    Ok(())
}

fn expire_open(store: &Store, age: std::time::Duration) {
    match store.expire_open(age) {
        Ok((0, _)) => {}
        Ok((objects, bytes)) => tracing::info!(
            objects,
            bytes,
            "abandoned uploads expired (open objects unchanged for {} s)",
            age.as_secs()
        ),
        Err(e) => tracing::error!("cannot expire abandoned uploads: {e:?}"),
    }
}
