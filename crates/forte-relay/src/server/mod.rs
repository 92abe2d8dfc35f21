//! `forte relay`: the HTTPS server in the DMZ.

mod auth;
mod body;
pub mod connections;
mod memory;
mod metrics;
pub use memory::DEFAULT_BUDGET as DEFAULT_BODY_MEMORY;
/// The relay's metrics in Prometheus' text format (what `GET /metrics` answers a core token).
pub use metrics::render as metrics_text;
mod share;
pub mod store;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use base64::Engine;
use forte_format::ObjectId;

pub use auth::{Principal, Tokens};
use share::{SharedBody, Shares};
use store::{Location, Store, StoreError, Stored};

use crate::api::{
    ApiError, BatchAck, BatchSeal, BatchSealQuery, ObjectState, ObjectStatus, ReadyObject,
    ReadyQuery, Receipts, Seal, SiteAnswer, StatusQuery, WholeQuery, GENERATION_HEADER,
    MANIFEST_LENGTH_HEADER, MAX_ACK_JSON, MAX_BATCH_SEAL_JSON, MAX_BODY, MAX_PART_INDEX,
    MAX_SEAL_JSON, MAX_SMALL_JSON, MAX_STATUS_QUERY, MAX_WAIT_MS, SHA256_HEADER, SHARE_HEADER,
};
use crate::tls::server_identity;

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
    /// Counts seals of objects and batches: what a long poll of `GET /v1/ready` waits on.
    seals: tokio::sync::watch::Sender<u64>,
    /// Each sending site's share of the ingress, paced as its uploads' bodies are read.
    shares: Arc<Shares>,
    /// The memory request bodies held whole may take together.
    bodies: memory::BodyMemory,
    /// How long a request's body may pause before it is given up (the idle timeout).
    body_stall: std::time::Duration,
}

impl Relay {
    /// Wakes every long poll waiting for a seal.
    fn sealed_something(&self) {
        self.seals.send_modify(|n| *n += 1);
    }
}

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
    let (relay, identity) = prepare(&config)?;
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
                    .acceptor(connections::CappedAcceptor::new(limits));
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
                if let Err(e) = server.serve(router(relay).into_make_service()).await {
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

/// Serves in the foreground until interrupted; prints where and how to pin the certificate.
pub fn run(config: RelayConfig) -> Result<()> {
    let config_grace = config.shutdown_grace;
    let relay = start(config)?;
    println!("relay listening on {}", relay.url());
    println!(
        "certificate {} (sha256 fingerprint {})",
        relay.cert_path.display(),
        relay.fingerprint
    );
    println!(
        "senders and pullers: --relay {} --relay-fingerprint {}",
        relay.url(),
        relay.fingerprint
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let grace = config_grace;
    let stop = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut hangup = signal(SignalKind::hangup())?;
        loop {
            tokio::select! {
                _ = term.recv() => return anyhow::Ok("SIGTERM"),
                _ = interrupt.recv() => return anyhow::Ok("SIGINT"),
                _ = hangup.recv() => match relay.reload_tokens() {
                    Ok(n) => tracing::info!(tokens = n, "tokens file reloaded (SIGHUP): {n} tokens in force"),
                    Err(e) => tracing::error!("tokens file not reloaded (SIGHUP), the tokens in force stay: {e:#}"),
                },
            }
        }
    })?;
    tracing::info!(
        "relay shutting down ({stop}): no new connections; requests in flight have {} s to finish (a second signal ends it at once)",
        grace.as_secs_f64()
    );
    // A second signal while the requests finish ends the relay at once.
    std::thread::spawn(move || {
        let again = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(again) = again {
            let _ = again.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                let mut term = signal(SignalKind::terminate())?;
                let mut interrupt = signal(SignalKind::interrupt())?;
                tokio::select! { _ = term.recv() => {}, _ = interrupt.recv() => {} }
                tracing::warn!("second signal: the relay ends at once; uploads cut off are sent again by their edges, and their partial files are removed at the next start");
                // Not a clean stop: what was in flight was cut off.
                std::process::exit(1);
                #[allow(unreachable_code)]
                anyhow::Ok(())
            });
        }
    });
    relay.shut_down(grace);
    tracing::info!("relay stopped");
    Ok(())
}

fn prepare(config: &RelayConfig) -> Result<(Arc<Relay>, crate::tls::ServerIdentity)> {
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
    let self_signed = config.tls_cert.is_none() && config.tls_key.is_none();
    let identity = match &config.store {
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
    };
    let relay = Arc::new(Relay {
        store,
        tokens,
        seals: tokio::sync::watch::channel(0).0,
        shares: Arc::new(Shares::new(config.fair_shares)),
        bodies: memory::BodyMemory::new(config.body_memory),
        body_stall: config.connections.idle,
    });
    if let Some(age) = config.expire_open_after {
        let weak = Arc::downgrade(&relay);
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
    }
    Ok((relay, identity))
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

fn router(relay: Arc<Relay>) -> Router {
    Router::new()
        // JSON bodies are held whole while they are parsed: each bounded by what it can hold.
        .route(
            "/v1/objects/status",
            post(object_statuses).layer(limit(MAX_SMALL_JSON)),
        )
        .route(
            "/v1/objects/{id}",
            get(object_status).put(seal).layer(limit(MAX_SEAL_JSON)),
        )
        .route("/v1/objects/{id}/parts/{index}", put(put_part))
        .route("/v1/objects/{id}/whole", put(put_whole))
        .route(
            "/v1/batches/{batch}",
            put(seal_batch).layer(limit(MAX_BATCH_SEAL_JSON)),
        )
        .route(
            "/v1/batches/{batch}/cancel",
            post(cancel_batch).layer(limit(MAX_SMALL_JSON)),
        )
        .route("/v1/batches/{batch}/receipts", get(get_receipts))
        .route("/v1/site", get(whoami))
        .route("/v1/ready", get(ready))
        .route("/metrics", get(render_metrics))
        .route(
            "/v1/sites/{site}/batches/{batch}/inventory",
            get(get_inventory),
        )
        .route(
            "/v1/sites/{site}/batches/{batch}/ack",
            post(ack_batch).layer(limit(MAX_ACK_JSON)),
        )
        .route("/v1/sites/{site}/objects/{id}/manifest", get(get_manifest))
        .route("/v1/sites/{site}/objects/{id}/parts/{index}", get(get_part))
        .route(
            "/v1/sites/{site}/objects/{id}/parts/{index}/reject",
            post(reject).layer(limit(MAX_SMALL_JSON)),
        )
        .route(
            "/v1/sites/{site}/objects/{id}/manifest/reject",
            post(reject_manifest).layer(limit(MAX_SMALL_JSON)),
        )
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn_with_state(relay.clone(), gate))
        .with_state(relay)
}

/// The largest body a route reads (its JSON is held whole while parsed).
fn limit(bytes: usize) -> DefaultBodyLimit {
    DefaultBodyLimit::max(bytes)
}

/// Runs before any handler reads a body: a request without a known token gets 401, and one
/// announcing a body over [`MAX_BODY`] gets 413, without a byte of the body being read. Only
/// authenticated sites can make the relay read a part (which it writes to disk as it arrives,
/// [`body`]); a body held whole (JSON, a manifest) takes its length from the relay's memory
/// budget first ([`memory`]). An upload's body is read at its site's share ([`share`]), and
/// the answer says the share when one is in force.
async fn gate(
    State(relay): State<Arc<Relay>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let principal = match principal(&relay, request.headers()) {
        Err(refused) => return refused.into_response(),
        Ok(principal) => principal,
    };
    let announced = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY as u64) {
        return Failure::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a body of at most {MAX_BODY} bytes is accepted"),
        )
        .into_response();
    }
    let holder = match &principal {
        Principal::Edge { site } => format!("site {site}"),
        Principal::Core { .. } => "the core".to_string(),
    };
    let stall = relay.body_stall;
    let meter = match held_in_memory(&request, announced) {
        Ok(None) => None,
        Ok(Some((declared, free))) => match relay.bodies.meter(&holder, declared, free) {
            Ok(meter) => Some(meter),
            Err(memory::TooLarge(why)) => {
                return Failure::new(StatusCode::PAYLOAD_TOO_LARGE, why).into_response()
            }
        },
        Err(refused) => return refused.into_response(),
    };
    let out_of_room = meter.as_ref().map(memory::Meter::refused);
    let request = request.map(|b| {
        let b = axum::body::Body::new(body::Stalling::new(b, stall));
        match meter {
            Some(meter) => axum::body::Body::new(memory::MeteredBody::new(b, meter)),
            None => b,
        }
    });
    // A body that found no room in time failed its handler's read: the answer says why.
    let answer = |response: Response| match out_of_room.and_then(|why| why.lock().take()) {
        Some(why) => Failure::new(StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
        None => response,
    };
    let site = match principal {
        Principal::Edge { site } if request.method() == axum::http::Method::PUT => site,
        _ => return answer(next.run(request).await),
    };
    let shares = relay.shares.clone();
    let request = request
        .map(|body| axum::body::Body::new(SharedBody::new(body, site.clone(), shares.clone())));
    let mut response = answer(next.run(request).await);
    if let Some(cap) = shares.cap_for(&site) {
        response
            .headers_mut()
            .insert(SHARE_HEADER, axum::http::HeaderValue::from(cap as u64));
    }
    response
}

/// How much of `request`'s body its handler holds whole in memory, as its declared length and
/// the bytes in front that it does not hold: `None` for a part (it goes to disk as it
/// arrives); a one-part object's part in front of its manifest; any other body whole, whose
/// length it must declare if it has one.
fn held_in_memory(
    request: &axum::extract::Request,
    announced: Option<u64>,
) -> Answer<Option<(u64, u64)>> {
    let path = request.uri().path();
    let is_put = request.method() == axum::http::Method::PUT;
    if is_put && path.starts_with("/v1/objects/") && path.contains("/parts/") {
        return Ok(None);
    }
    let declared = match announced {
        Some(length) => length,
        None if request
            .headers()
            .contains_key(axum::http::header::TRANSFER_ENCODING) =>
        {
            return Err(Failure::new(
                StatusCode::LENGTH_REQUIRED,
                "a request body must declare its Content-Length".to_string(),
            ))
        }
        None => 0,
    };
    if is_put && path.starts_with("/v1/objects/") && path.ends_with("/whole") {
        let manifest = request
            .headers()
            .get(MANIFEST_LENGTH_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        // The handler refuses a missing or impossible length.
        let manifest = manifest.unwrap_or(0).min(declared);
        return Ok(Some((declared, declared - manifest)));
    }
    Ok(Some((declared, 0)))
}

/// An error answer: a status and a JSON body that says what and why, and for an upload or
/// seal refused because the relay holds the object already (sealed, or delivered), in which
/// state: the edge then asks the relay what it holds instead of failing the batch.
struct Failure {
    status: StatusCode,
    message: String,
    held: Option<ObjectState>,
}

impl Failure {
    fn new(status: StatusCode, message: String) -> Self {
        Self {
            status,
            message,
            held: None,
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let Failure {
            status,
            message,
            held,
        } = self;
        ::metrics::counter!("forte_relay_refused_total", "status" => status.as_u16().to_string())
            .increment(1);
        if status == StatusCode::NOT_FOUND {
            // Asking about objects the relay does not hold is routine (resume, status).
            tracing::debug!(status = 404, "{message}");
        } else if status != StatusCode::INTERNAL_SERVER_ERROR {
            // Logged with its detail where it arose (`internal_error`).
            tracing::warn!(status = status.as_u16(), "refused: {message}");
        }
        let body = ApiError {
            error: message,
            held,
        };
        let mut r = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert("www-authenticate", "Bearer".parse().expect("valid header"));
            // A connection that sent no valid token is not kept for its next request: without
            // this, tokenless requests every few seconds held connections open for good.
            r.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        r
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(m) => Failure::new(StatusCode::NOT_FOUND, m),
            StoreError::Conflict(m) => Failure::new(StatusCode::CONFLICT, m),
            StoreError::Held(state, message) => Failure {
                status: StatusCode::CONFLICT,
                message,
                held: Some(state),
            },
            StoreError::Invalid(m) => Failure::new(StatusCode::UNPROCESSABLE_ENTITY, m),
            StoreError::Full(m) => Failure::new(StatusCode::INSUFFICIENT_STORAGE, m),
            // Not worth retrying: nothing will free the space unless someone acts.
            StoreError::NoRoom(m) => Failure::new(StatusCode::PAYLOAD_TOO_LARGE, m),
            StoreError::Io(m) => internal_error(&m),
        }
    }
}

/// What a client is told when the relay itself failed (its disk, a worker): nothing of the
/// relay's file system. The full detail goes to the relay's log only.
const INTERNAL_ERROR: &str = "relay storage error; see the relay's log";

fn internal_error(detail: &str) -> Failure {
    tracing::error!(status = 500, "storage error: {detail}");
    Failure::new(StatusCode::INTERNAL_SERVER_ERROR, INTERNAL_ERROR.into())
}

type Answer<T> = std::result::Result<T, Failure>;

fn principal(relay: &Relay, headers: &HeaderMap) -> Answer<Principal> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| Failure::new(StatusCode::UNAUTHORIZED, "missing bearer token".into()))?;
    let tokens = relay.tokens.read().clone();
    tokens
        .lookup(token)
        .ok_or_else(|| Failure::new(StatusCode::UNAUTHORIZED, "unknown token".into()))
}

fn edge_site(relay: &Relay, headers: &HeaderMap) -> Answer<String> {
    match principal(relay, headers)? {
        Principal::Edge { site } => Ok(site),
        Principal::Core { .. } => Err(Failure::new(
            StatusCode::FORBIDDEN,
            "a core token cannot upload".into(),
        )),
    }
}

fn core_for(relay: &Relay, headers: &HeaderMap, site: &str) -> Answer<()> {
    let who = principal(relay, headers)?;
    if !crate::api::valid_site(site) {
        // Site names become directory names: nothing like `..` gets that far.
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!("{site:?} is not a site name"),
        ));
    }
    if who.pulls(site) {
        Ok(())
    } else {
        // Not 403: a token must not learn which other sites exist.
        Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("no site {site} for this token"),
        ))
    }
}

fn object_id(text: &str) -> Answer<ObjectId> {
    text.parse()
        .map_err(|e: String| Failure::new(StatusCode::BAD_REQUEST, e))
}

/// Refuses a batch id the store could not use as a file name.
fn check_batch(batch: &str) -> Answer<()> {
    if crate::api::valid_batch(batch) {
        Ok(())
    } else {
        Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!("batch id {batch:?} is not valid"),
        ))
    }
}

fn part_index(index: u32) -> Answer<u32> {
    if index > MAX_PART_INDEX {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!("part index {index} is out of range"),
        ));
    }
    Ok(index)
}

/// Runs blocking store work (disk, hashing) off the async workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::result::Result<T, StoreError> + Send + 'static,
) -> Answer<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| internal_error(&format!("worker failed: {e}")))?
        .map_err(Failure::from)
}

/// A part, written to the store as it arrives ([`body`]): its declared length is charged to
/// the site's quota before a byte of it is read.
async fn put_part(
    State(relay): State<Arc<Relay>>,
    Path((id, index)): Path<(String, u32)>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Answer<StatusCode> {
    let site = edge_site(&relay, &headers)?;
    let (id, index) = (object_id(&id)?, part_index(index)?);
    let sha256 = required_header(&headers, SHA256_HEADER)?;
    let length = body::declared_length(&headers)?;
    let r = relay.clone();
    let stored = body::with_body(body, move |chunks| {
        let mut upload = r.store.begin_part(&site, id, index, &sha256, length)?;
        for chunk in chunks {
            upload.write(&chunk)?;
        }
        upload.finish()
    })
    .await?;
    Ok(part_stored(stored, id, index, length))
}

/// Logs and counts a part the store took; the answer for it.
fn part_stored(stored: Stored, id: ObjectId, index: u32, length: u64) -> StatusCode {
    match stored {
        Stored::New => {
            tracing::info!(object = %id, part = index, "part stored");
            ::metrics::counter!("forte_relay_parts_stored_total").increment(1);
            ::metrics::counter!("forte_relay_part_bytes_total").increment(length);
            StatusCode::CREATED
        }
        Stored::AlreadyHeld => {
            ::metrics::counter!("forte_relay_parts_already_held_total").increment(1);
            StatusCode::OK
        }
    }
}

/// Wakes the long polls and logs and counts an object sealed.
fn object_sealed(relay: &Relay, id: ObjectId) {
    relay.sealed_something();
    tracing::info!(object = %id, "object sealed");
    ::metrics::counter!("forte_relay_objects_sealed_total").increment(1);
}

/// A header the request cannot do without.
fn required_header(headers: &HeaderMap, name: &str) -> Result<String, Failure> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| Failure::new(StatusCode::BAD_REQUEST, format!("missing {name} header")))
}

/// A one-part object stored and sealed in one request: its part, then its manifest
/// ([`MANIFEST_LENGTH_HEADER`]). The same checks as the two requests it replaces.
async fn put_whole(
    State(relay): State<Arc<Relay>>,
    Path(id): Path<String>,
    Query(query): Query<WholeQuery>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Answer<StatusCode> {
    let site = edge_site(&relay, &headers)?;
    let id = object_id(&id)?;
    check_batch(&query.batch)?;
    let sha256 = required_header(&headers, SHA256_HEADER)?;
    let length = body::declared_length(&headers)?;
    let manifest_len = required_header(&headers, MANIFEST_LENGTH_HEADER)?
        .parse::<u64>()
        .ok()
        .filter(|&n| n <= length && n <= MAX_SEAL_JSON as u64)
        .ok_or_else(|| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                format!("{MANIFEST_LENGTH_HEADER} is not a length within the body (and at most {MAX_SEAL_JSON} bytes)"),
            )
        })?;
    let part_len = length - manifest_len;
    let r = relay.clone();
    let stored = body::with_body(body, move |chunks| {
        let mut upload = r.store.begin_part(&site, id, 0, &sha256, part_len)?;
        let mut manifest = Vec::with_capacity(manifest_len as usize);
        let mut to_part = part_len;
        for mut chunk in chunks {
            let into_part = chunk.split_to((to_part as usize).min(chunk.len()));
            to_part -= into_part.len() as u64;
            upload.write(&into_part)?;
            manifest.extend_from_slice(&chunk);
        }
        r.store.put_whole(upload, &query.batch, &manifest)
    })
    .await?;
    part_stored(stored, id, 0, part_len);
    object_sealed(&relay, id);
    Ok(StatusCode::CREATED)
}

async fn object_status(
    State(relay): State<Arc<Relay>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Answer<Json<ObjectStatus>> {
    let site = edge_site(&relay, &headers)?;
    let id = object_id(&id)?;
    let r = relay.clone();
    Ok(Json(blocking(move || r.store.status(&site, id)).await?))
}

async fn object_statuses(
    State(relay): State<Arc<Relay>>,
    headers: HeaderMap,
    Json(query): Json<StatusQuery>,
) -> Answer<Json<std::collections::BTreeMap<String, ObjectStatus>>> {
    let site = edge_site(&relay, &headers)?;
    if query.ids.len() > MAX_STATUS_QUERY {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!("at most {MAX_STATUS_QUERY} ids per status query"),
        ));
    }
    let asked = query.ids.len();
    let r = relay.clone();
    let answer: std::collections::BTreeMap<_, _> = blocking(move || {
        let found = r.store.statuses(&site, &query.ids)?;
        Ok(found
            .into_iter()
            .map(|(id, s)| (id.to_string(), s))
            .collect())
    })
    .await?;
    // An empty query only opens a connection (the edge's workers do so before a pass).
    if asked > 0 {
        tracing::info!(objects = asked, held = answer.len(), "status asked");
    }
    Ok(Json(answer))
}

async fn seal(
    State(relay): State<Arc<Relay>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(seal): Json<Seal>,
) -> Answer<StatusCode> {
    let site = edge_site(&relay, &headers)?;
    let id = object_id(&id)?;
    check_batch(&seal.batch)?;
    let manifest = base64::engine::general_purpose::STANDARD
        .decode(&seal.manifest)
        .map_err(|e| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                format!("manifest is not base64: {e}"),
            )
        })?;
    let r = relay.clone();
    blocking(move || r.store.seal(&site, id, &seal.batch, &seal.parts, &manifest)).await?;
    object_sealed(&relay, id);
    Ok(StatusCode::CREATED)
}

async fn seal_batch(
    State(relay): State<Arc<Relay>>,
    Path(batch): Path<String>,
    Query(query): Query<BatchSealQuery>,
    headers: HeaderMap,
    Json(seal): Json<BatchSeal>,
) -> Answer<StatusCode> {
    let site = edge_site(&relay, &headers)?;
    check_batch(&batch)?;
    let inventory = match &seal.inventory {
        Some(text) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|_| {
                    Failure::new(
                        StatusCode::BAD_REQUEST,
                        format!("the inventory of batch {batch} is not base64"),
                    )
                })?,
        ),
        None => None,
    };
    let objects = seal.objects;
    let count = objects.len();
    // After a wait that saw every object sealed or delivered, they need not be looked at again.
    let present = match query.wait_ms {
        Some(wait) => wait_for_members(&relay, (&site, &batch), &objects, wait).await?,
        None => false,
    };
    let (r, b) = (relay.clone(), batch.clone());
    blocking(move || {
        let inventory = inventory.as_deref();
        match present {
            true => r.store.write_batch_seal(&site, &b, &objects, inventory),
            false => r.store.seal_batch(&site, &b, &objects, inventory),
        }
    })
    .await?;
    relay.sealed_something();
    tracing::info!(batch = %batch, objects = count, "batch sealed");
    ::metrics::counter!("forte_relay_batches_sealed_total").increment(1);
    Ok(StatusCode::CREATED)
}

/// Waits up to `wait_ms` (at most [`MAX_WAIT_MS`]) until every one of `objects` is sealed or
/// delivered: an edge seals a batch while its last objects are still crossing the link, so
/// that the seal does not wait a round trip after them. Whether none is missing at the end;
/// after the first look only the missing ones are looked at again.
async fn wait_for_members(
    relay: &Arc<Relay>,
    (site, batch): (&str, &str),
    objects: &[ObjectId],
    wait_ms: u64,
) -> Result<bool, Failure> {
    let deadline =
        tokio::time::Instant::now() + std::time::Duration::from_millis(wait_ms.min(MAX_WAIT_MS));
    let mut seals = relay.seals.subscribe();
    let mut waiting = objects.to_vec();
    let mut first = true;
    loop {
        // Marked seen before looking, so that a seal during the look wakes the next wait.
        seals.borrow_and_update();
        let (r, site) = (relay.clone(), site.to_string());
        waiting = blocking(move || Ok(r.store.unsealed(&site, &waiting))).await?;
        if waiting.is_empty() {
            return Ok(true);
        }
        if std::mem::take(&mut first) {
            let objects = waiting.len();
            tracing::info!(batch = %batch, objects, "batch seal waits for objects on the way");
        }
        // Timing out is an answer too: the seal then names what is missing.
        if tokio::time::timeout_at(deadline, seals.changed())
            .await
            .is_err()
        {
            return Ok(false);
        }
    }
}

/// The edge cancels one of its batches: the listed objects (open or sealed, not delivered)
/// and the batch's seal are deleted, so the core never gets it.
async fn cancel_batch(
    State(relay): State<Arc<Relay>>,
    Path(batch): Path<String>,
    headers: HeaderMap,
    Json(cancel): Json<BatchAck>,
) -> Answer<Json<crate::api::Cancelled>> {
    let site = edge_site(&relay, &headers)?;
    check_batch(&batch)?;
    let r = relay.clone();
    let b = batch.clone();
    let (objects, bytes) = blocking(move || r.store.cancel(&site, &b, &cancel.objects)).await?;
    tracing::info!(batch = %batch, objects, bytes, "batch cancelled by its edge");
    Ok(Json(crate::api::Cancelled { objects, bytes }))
}

/// Prometheus metrics, for a core token (scrapers authenticate like pullers).
async fn render_metrics(State(relay): State<Arc<Relay>>, headers: HeaderMap) -> Answer<String> {
    match principal(&relay, &headers)? {
        Principal::Core { .. } => Ok(metrics::render()),
        Principal::Edge { .. } => Err(Failure::new(
            StatusCode::FORBIDDEN,
            "metrics need a core token".into(),
        )),
    }
}

async fn ready(
    State(relay): State<Arc<Relay>>,
    headers: HeaderMap,
    Query(query): Query<ReadyQuery>,
) -> Answer<([(&'static str, String); 1], Json<Vec<ReadyObject>>)> {
    let sites = match principal(&relay, &headers)? {
        Principal::Core { sites } => sites,
        Principal::Edge { .. } => {
            return Err(Failure::new(
                StatusCode::FORBIDDEN,
                "an edge token cannot pull".into(),
            ))
        }
    };
    let mut seals = relay.seals.subscribe();
    if let Some(after) = query.after {
        let wait = std::time::Duration::from_millis(query.wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
        // Timing out is an answer too: the listing as it is.
        let _ = tokio::time::timeout(wait, seals.wait_for(|n| *n > after)).await;
    }
    // Read before listing: a seal during the listing makes the next long poll return at once.
    let generation = *seals.borrow_and_update();
    let r = relay.clone();
    let listing = blocking(move || Ok(r.store.ready(&sites, query.open))).await?;
    Ok(([(GENERATION_HEADER, generation.to_string())], Json(listing)))
}

/// The sealed inventory of a sealed batch; 404 if the batch was sealed without one.
async fn get_inventory(
    State(relay): State<Arc<Relay>>,
    Path((site, batch)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer<Vec<u8>> {
    core_for(&relay, &headers, &site)?;
    check_batch(&batch)?;
    let r = relay.clone();
    let b = batch.clone();
    blocking(move || r.store.read_inventory(&site, &b))
        .await?
        .ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_FOUND,
                format!("batch {batch} was sealed without an inventory"),
            )
        })
}

async fn get_manifest(
    State(relay): State<Arc<Relay>>,
    Path((site, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer<Vec<u8>> {
    core_for(&relay, &headers, &site)?;
    let id = object_id(&id)?;
    let r = relay.clone();
    blocking(move || r.store.read_manifest(&site, id)).await
}

async fn get_part(
    State(relay): State<Arc<Relay>>,
    Path((site, id, index)): Path<(String, String, u32)>,
    headers: HeaderMap,
) -> Answer<Response> {
    core_for(&relay, &headers, &site)?;
    let (id, index) = (object_id(&id)?, part_index(index)?);
    let r = relay.clone();
    let part = blocking(move || r.store.open_part(&site, id, index)).await?;
    Ok(body::stream_out(
        part,
        format!("part {index} of object {id}"),
    ))
}

async fn ack_batch(
    State(relay): State<Arc<Relay>>,
    Path((site, batch)): Path<(String, String)>,
    headers: HeaderMap,
    Json(ack): Json<BatchAck>,
) -> Answer<StatusCode> {
    core_for(&relay, &headers, &site)?;
    check_batch(&batch)?;
    let r = relay.clone();
    let count = ack.objects.len() as u64;
    let b = batch.clone();
    let receipt = match ack.receipt.as_deref() {
        Some(text) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| Failure::new(StatusCode::BAD_REQUEST, format!("receipt: {e}")))?,
        ),
        None => None,
    };
    blocking(move || {
        r.store
            .ack_batch(&site, &b, &ack.objects, receipt.as_deref())
    })
    .await?;
    tracing::info!(batch = %batch, objects = count, "delivery of a batch acknowledged; objects deleted");
    ::metrics::counter!("forte_relay_objects_acknowledged_total").increment(count);
    Ok(StatusCode::NO_CONTENT)
}

/// The site an edge token belongs to: what `send` signs into its inventories when no `--site`
/// says otherwise.
async fn whoami(State(relay): State<Arc<Relay>>, headers: HeaderMap) -> Answer<Json<SiteAnswer>> {
    let site = edge_site(&relay, &headers)?;
    Ok(Json(SiteAnswer { site }))
}

/// The core's receipts for one of this edge's batches, for the edge to verify before it
/// deletes anything.
async fn get_receipts(
    State(relay): State<Arc<Relay>>,
    Path(batch): Path<String>,
    headers: HeaderMap,
) -> Answer<Json<Receipts>> {
    let site = edge_site(&relay, &headers)?;
    check_batch(&batch)?;
    let r = relay.clone();
    let receipts = blocking(move || r.store.receipts(&site, &batch)).await?;
    let receipts = receipts
        .iter()
        .map(|r| base64::engine::general_purpose::STANDARD.encode(r))
        .collect();
    Ok(Json(Receipts { receipts }))
}

/// A manifest the core could not open although it opened the batch's inventory: dropped, and
/// the object reopened for the edge to seal again.
async fn reject_manifest(
    State(relay): State<Arc<Relay>>,
    Path((site, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer<StatusCode> {
    core_for(&relay, &headers, &site)?;
    let id = object_id(&id)?;
    let r = relay.clone();
    blocking(move || r.store.reject_manifest(&site, id)).await?;
    tracing::warn!(object = %id, "manifest reported damaged by the core; dropped");
    ::metrics::counter!("forte_relay_manifests_rejected_total").increment(1);
    Ok(StatusCode::NO_CONTENT)
}

async fn reject(
    State(relay): State<Arc<Relay>>,
    Path((site, id, index)): Path<(String, String, u32)>,
    headers: HeaderMap,
) -> Answer<StatusCode> {
    core_for(&relay, &headers, &site)?;
    let (id, index) = (object_id(&id)?, part_index(index)?);
    let r = relay.clone();
    blocking(move || r.store.reject(&site, id, index)).await?;
    tracing::warn!(object = %id, part = index, "part reported damaged by the core; dropped");
    ::metrics::counter!("forte_relay_parts_rejected_total").increment(1);
    Ok(StatusCode::NO_CONTENT)
}
