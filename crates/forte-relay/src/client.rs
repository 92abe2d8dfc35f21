//! A blocking client of the relay, for the worker threads of `send` and `pull`.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use forte_format::ObjectId;
use parking_lot::{Condvar, Mutex};
use reqwest::blocking::{Body, Client, RequestBuilder, Response};
use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;
use serde::Serialize;

use std::collections::HashMap;

use crate::api::{
    ApiError, BatchAck, Cancelled, ObjectState, ObjectStatus, PartRef, ReadyObject, Receipts, Seal,
    SiteAnswer, StatusQuery, MANIFEST_LENGTH_HEADER, MAX_JSON_ANSWER, MAX_STATUS_QUERY,
    SHA256_HEADER, SHARE_HEADER,
};
use crate::pace::{Paced, Pacer};
use crate::tls::{client_config, FingerprintMismatch, RelayTrust};

/// Status queries in flight together: 100 000 large files are 100 queries, which one after
/// another would wait 100 round trips.
const STATUS_QUERIES_AT_ONCE: usize = 8;

/// Told of an upload's body bytes as its connection takes them: (object, part, bytes).
pub type OnSent = Arc<dyn Fn(ObjectId, u32, u64) + Send + Sync>;

/// An upload's body read piece by piece (paced, counted or told): counted into its client's
/// [`RelayClient::sent_bytes`] as the connection reads it, and told to [`OnSent`] if one
/// listens, a [`TOLD_EVERY`] at a time and the rest with its last byte (the connection reads
/// no further than the length it declared): often enough to follow an upload of a few
/// megabytes, rarely enough that telling costs nothing beside sending.
struct Told {
    body: Box<dyn Read + Send>,
    part: PartOf,
    /// Bytes not read yet.
    left: u64,
    /// Bytes read and not told yet.
    untold: u64,
    on_sent: Option<OnSent>,
    sent: Arc<AtomicU64>,
}

const TOLD_EVERY: u64 = 64 << 10;

/// Which part an upload's body is: part `index` of object `id`.
#[derive(Clone, Copy)]
struct PartOf {
    id: ObjectId,
    index: u32,
}

impl Read for Told {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.body.read(buf)?;
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
        let Some(on_sent) = &self.on_sent else {
            return Ok(n);
        };
        self.untold += n as u64;
        self.left = self.left.saturating_sub(n as u64);
        if self.untold >= TOLD_EVERY || (self.left == 0 && self.untold > 0) {
            on_sent(self.part.id, self.part.index, self.untold);
            self.untold = 0;
        }
        Ok(n)
    }
}

/// A failed request: the HTTP status if the relay answered, and what it said.
#[derive(Debug, Clone, thiserror::Error)]
#[error("relay {url}: {message}")]
pub struct RelayError {
    pub url: String,
    pub status: Option<u16>,
    pub message: String,
    /// No answer, and none will come however often we ask: the relay's certificate is not the
    /// one we trust, it does not speak TLS, or the URL is unusable. Only for `status: None`.
    pub permanent: bool,
    /// An upload or seal refused because the relay holds the object already, in this state.
    pub held: Option<ObjectState>,
}

impl RelayError {
    /// Worth trying again later: no answer (network down, connection refused or reset,
    /// timeout) unless it can never come, a server error (5xx, including 507 Full), a request
    /// timeout (408) or too many requests (429). Every other answer of the relay (401 bad
    /// token, 403 wrong role, 400-class protocol errors) and every TLS certificate error is for
    /// good: a person has to change something first.
    pub fn is_transient(&self) -> bool {
        match self.status {
            None => !self.permanent,
            Some(s) => s >= 500 || s == 429 || s == 408,
        }
    }

    /// A request that got no answer; classified by its cause.
    fn transport(url: String, e: reqwest::Error) -> Self {
        let chain = source_chain(&e);
        let advice = tls_cause(&e).and_then(tls_advice);
        let builder = e.is_builder();
        let connecting = e.is_connect();
        // Without the URL: `Display` shows it once already.
        let what = format!("{}{chain}", e.without_url());
        let (message, permanent) = match advice {
            Some(advice) => (advice, true),
            None if builder => (format!("not a usable relay URL: {what}"), true),
            None if connecting && closed_at_once(&what) => (
                format!(
                    "{what}: the relay closed the connection before answering; if it goes on, \
                     it holds as many connections from this address as it allows \
                     (relay --max-connections-per-address) or in all (--max-connections), \
                     which its log says"
                ),
                false,
            ),
            None => (what, false),
        };
        RelayError {
            url,
            status: None,
            message,
            permanent,
            held: None,
        }
    }

    /// The relay answered with an error status.
    fn answered(url: String, status: StatusCode, said: ApiError) -> Self {
        let ApiError { error: said, held } = said;
        let message = match status {
            StatusCode::UNAUTHORIZED => format!(
                "the relay refused the token ({status}: {said}): check --token-file \
                 (or FORTE_TOKEN) against the relay's token file"
            ),
            StatusCode::FORBIDDEN => format!(
                "the relay refused this request for this token ({status}: {said}): \
                 `send` needs an edge token, `pull` a core token"
            ),
            _ => format!("{status}: {said}"),
        };
        RelayError {
            url,
            status: Some(status.as_u16()),
            message,
            permanent: false,
            held,
        }
    }
}

pub type Result<T> = std::result::Result<T, RelayError>;

/// Where the relay is and how to prove who we are.
#[derive(Debug, Clone)]
pub struct RelayEndpoint {
    pub url: String,
    pub token: String,
    pub trust: RelayTrust,
}

/// How long a body of `len` bytes may take beyond the usual timeout: a limit is shared by
/// every upload going at once (`at_once`), so a body takes up to that many times its bytes'
/// time at the slowest rate it may go at, the lowest of its own timetable (`own`) and the share
/// of the relay's ingress the relay last gave this site (`share`, several sites at once).
fn paced_for(len: usize, at_once: usize, own: Option<f64>, share: Option<f64>) -> Duration {
    lower(own, share).map_or(Duration::ZERO, |rate| {
        Duration::from_secs_f64((len * at_once) as f64 / rate)
    })
}

/// The lower of two limits, either of which may be none.
fn lower(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Connections announced by [`RelayClient::opening_connections`], which uploads wait for until
/// they are open or this is dropped.
pub struct OpeningConnections<'a> {
    client: &'a RelayClient,
    n: usize,
}

impl OpeningConnections<'_> {
    /// Opens the connections at once, each with a TLS handshake and an empty status query, so
    /// that upload workers starting together find them open instead of each waiting a round
    /// trip for its own handshake. Best effort: a failure that may heal shows again, with
    /// retries, on the first real request; one that cannot is kept, and every later upload
    /// fails with it at once.
    pub fn open(self) {
        let client = self.client;
        let refused = std::thread::scope(|s| {
            let opening: Vec<_> = (0..self.n)
                .map(|_| s.spawn(|| client.status_query(&[])))
                .collect();
            opening
                .into_iter()
                .filter_map(|o| o.join().expect("opening a connection panicked").err())
                .find(|e| !e.is_transient())
        });
        if refused.is_some() {
            *client.refused.lock() = refused;
        }
    }
}

impl Drop for OpeningConnections<'_> {
    fn drop(&mut self) {
        *self.client.opening.lock() -= 1;
        self.client.opened.notify_all();
    }
}

pub struct RelayClient {
    http: Client,
    base: String,
    token: String,
    timeout: Duration,
    /// Paces the parts it uploads, when a bandwidth limit is set.
    pacer: Option<Arc<Pacer>>,
    /// Told of the bytes of each upload's body as its connection takes them, if anyone asked.
    on_sent: Option<OnSent>,
    /// How many uploads may go at once, sharing a limit (its own or the relay's share).
    uploads_at_once: usize,
    /// Bytes of upload bodies its connections have taken so far, retries included, once
    /// [`RelayClient::count_sent`] was called (or `on_sent` listens).
    sent: Arc<AtomicU64>,
    counting_sent: AtomicBool,
    /// The share of the relay's ingress its last upload's answer gave this site, in bytes per
    /// second as f64 bits; 0 while none is in force.
    relay_share: AtomicU64,
    /// [`OpeningConnections`] under way: uploads wait for the connections
    /// they open rather than each opening its own, a handshake's round trips later.
    opening: Mutex<usize>,
    opened: Condvar,
    /// What no retry can fix that opening the connections met (a refused token, a certificate
    /// that is not the pinned one): uploads fail with it rather than send. An upload the relay
    /// refuses before reading its body would otherwise end in a broken pipe, which looks like
    /// a network fault and is retried.
    refused: Mutex<Option<RelayError>>,
}

impl RelayClient {
    /// Refuses a URL that is not `https://` before any connection: the relay speaks only
    /// HTTPS, and no retry would change that.
    pub fn new(endpoint: &RelayEndpoint, timeout: Duration) -> anyhow::Result<Self> {
        check_url(&endpoint.url)?;
        let tls = client_config(&endpoint.trust)?;
        let http = Client::builder()
            .https_only(true)
            .tls_backend_preconfigured(tls)
            .connect_timeout(Duration::from_secs(10))
            .timeout(timeout)
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the HTTPS client: {e}"))?;
        Ok(Self {
            http,
            base: endpoint.url.trim_end_matches('/').to_string(),
            token: endpoint.token.clone(),
            timeout,
            pacer: None,
            on_sent: None,
            sent: Arc::default(),
            counting_sent: AtomicBool::new(false),
            uploads_at_once: 1,
            relay_share: AtomicU64::new(0),
            opening: Mutex::new(0),
            opened: Condvar::new(),
            refused: Mutex::new(None),
        })
    }

    /// Uploads at most `at_once` parts at a time from now on, through `pacer` if a bandwidth
    /// limit is set: each request's body goes out at the pacer's rate, shared with the other
    /// uploads of this client.
    pub fn uploading(mut self, at_once: usize, pacer: Option<Arc<Pacer>>) -> Self {
        self.uploads_at_once = at_once.max(1);
        self.pacer = pacer;
        self
    }

    /// Tells `on_sent` of the bytes of each part it uploads as its connection takes them
    /// (object, part, bytes): how far an upload under way has come, which its answer alone
    /// tells only at the end. A retried upload starts from its first byte again.
    pub fn telling_sent(mut self, on_sent: OnSent) -> Self {
        self.on_sent = Some(on_sent);
        self
    }

    /// A request carrying `body`, part `part` of an object, paced when a limit is set and
    /// told as it goes when asked, with the time the slowest limit it may go at makes it take
    /// added to the request's timeout: pacing, its own or the relay's reading at this site's
    /// share, never turns into a timeout.
    fn upload(&self, request: RequestBuilder, body: Vec<u8>, part: PartOf) -> RequestBuilder {
        let own = self.pacer.as_ref().and_then(|p| p.timetable().lowest());
        let paced_for = paced_for(body.len(), self.uploads_at_once, own, self.relay_share());
        let request = request.timeout(self.timeout + paced_for);
        if !self.reads_bodies_piecewise() {
            // As one piece: read through `Told`, reqwest sends a body 8 KiB at a time, which
            // cost the edge 8 % more CPU at 20 ms, where it is what bounds the rate.
            return request.body(body);
        }
        let len = body.len() as u64;
        let body: Box<dyn Read + Send> = match &self.pacer {
            Some(pacer) => Box::new(Paced::new(body, pacer.clone())),
            None => Box::new(std::io::Cursor::new(body)),
        };
        let told = Told {
            body,
            part,
            left: len,
            untold: 0,
            on_sent: self.on_sent.clone(),
            sent: self.sent.clone(),
        };
        request.body(Body::sized(told, len))
    }

    /// The share of the relay's ingress it holds this site to, if any.
    fn relay_share(&self) -> Option<f64> {
        let share = f64::from_bits(self.relay_share.load(Ordering::Relaxed));
        (share > 0.0).then_some(share)
    }

    /// How long one request may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The relay's URL: what this client's history of tuning is kept under.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The limit its uploads go at now, if any: its own pacer's, or the share of the relay's
    /// ingress the relay holds this site to while other sites send, whichever is lower.
    pub fn upload_limit(&self) -> Option<f64> {
        lower(
            self.pacer.as_ref().and_then(|pacer| pacer.rate()),
            self.relay_share(),
        )
    }

    /// Counts the bytes of upload bodies as its connections take them from now on
    /// ([`RelayClient::sent_bytes`]).
    pub fn count_sent(&self) {
        self.counting_sent.store(true, Ordering::Relaxed);
    }

    /// Whether upload bodies go through [`Told`], paced, counted or told, rather than whole.
    fn reads_bodies_piecewise(&self) -> bool {
        self.pacer.is_some() || self.on_sent.is_some() || self.counting_sent.load(Ordering::Relaxed)
    }

    /// The bytes of upload bodies its connections have taken so far (retries included), if
    /// every upload is counted ([`RelayClient::count_sent`], a pacer or an `on_sent`): what
    /// the link carries, measured as it goes rather than a whole request at a time when the
    /// relay answers. Ahead of the link by no more than the connections' send buffers.
    pub fn sent_bytes(&self) -> Option<u64> {
        self.reads_bodies_piecewise()
            .then(|| self.sent.load(Ordering::Relaxed))
    }

    /// The bytes its uploads have sent through its own bandwidth limit so far, if it has one:
    /// the rate the link carries, measured smoothly.
    pub fn paced_bytes(&self) -> Option<u64> {
        self.pacer.as_ref().map(|pacer| pacer.passed())
    }

    /// Sends an upload of `part` and keeps the share its answer gives (or that none is in
    /// force).
    fn send_upload(
        &self,
        url: String,
        request: RequestBuilder,
        body: Vec<u8>,
        part: PartOf,
    ) -> Result<()> {
        self.wait_for_connections();
        if let Some(refused) = self.refused.lock().clone() {
            return Err(refused);
        }
        let response = self.send(url, self.upload(request, body, part))?;
        let share = response
            .headers()
            .get(SHARE_HEADER)
            .and_then(|v| v.to_str().ok()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        self.relay_share.store(share.to_bits(), Ordering::Relaxed);
        Ok(())
    }

    /// The time of one empty status query: a round trip to the relay on an open connection
    /// (after [`OpeningConnections::open`]), the relay's work on it next to nothing.
    pub fn round_trip(&self) -> Result<Duration> {
        let start = std::time::Instant::now();
        self.status_query(&[])?;
        Ok(start.elapsed())
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn send(&self, url: String, request: RequestBuilder) -> Result<Response> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .map_err(|e| RelayError::transport(url.clone(), e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let said = response.json::<ApiError>().unwrap_or_else(|_| ApiError {
            error: status.canonical_reason().unwrap_or("error").to_string(),
            held: None,
        });
        Err(RelayError::answered(url, status, said))
    }

    /// The answer's body, read as it streams in and cut at `max + 1` bytes: whatever the
    /// relay sends (or says it sends), no more than that is ever held. The caller compares
    /// the length with what it expects, so a body one byte too long is told from a right one.
    fn body(url: &str, response: Response, max: u64) -> Result<Vec<u8>> {
        let announced = response.content_length().unwrap_or(0);
        let mut bytes =
            Vec::with_capacity(announced.min(max.saturating_add(1)).min(64 << 20) as usize);
        response
            .take(max.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| RelayError {
                url: url.to_string(),
                status: None,
                message: format!("reading the answer: {e}"),
                permanent: false,
                held: None,
            })?;
        Ok(bytes)
    }

    /// A JSON answer of at most [`MAX_JSON_ANSWER`] bytes.
    fn json<T: serde::de::DeserializeOwned>(url: &str, response: Response) -> Result<T> {
        let bytes = Self::body(url, response, MAX_JSON_ANSWER)?;
        decode(url, &bytes, MAX_JSON_ANSWER)
    }

    /// Uploads a sealed part; the relay checks `sha256` before answering.
    pub fn put_part(&self, id: ObjectId, index: u32, sealed: &[u8], sha256: &str) -> Result<()> {
        let url = self.url(&format!("/v1/objects/{id}/parts/{index}"));
        self.send_upload(
            url.clone(),
            self.http.put(&url).header(SHA256_HEADER, sha256),
            sealed.to_vec(),
            PartOf { id, index },
        )
    }

    /// Stores and seals a one-part object in one request: its sealed part (SHA-256 `sha256`)
    /// and its sealed manifest, for `batch`.
    pub fn put_whole(
        &self,
        id: ObjectId,
        batch: &str,
        sealed: &[u8],
        sha256: &str,
        manifest: &[u8],
    ) -> Result<()> {
        let url = self.url(&format!("/v1/objects/{id}/whole?batch={batch}"));
        let body = [sealed, manifest].concat();
        self.send_upload(
            url.clone(),
            self.http
                .put(&url)
                .header(SHA256_HEADER, sha256)
                .header(MANIFEST_LENGTH_HEADER, manifest.len()),
            body,
            PartOf { id, index: 0 },
        )
    }

    /// What the relay holds of an object; `None` if it has never heard of it.
    pub fn status(&self, id: ObjectId) -> Result<Option<ObjectStatus>> {
        let url = self.url(&format!("/v1/objects/{id}"));
        match self.send(url.clone(), self.http.get(&url)) {
            Ok(r) => Self::json(&url, r).map(Some),
            Err(e) if e.status == Some(StatusCode::NOT_FOUND.as_u16()) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// What the relay holds of many objects, in queries of at most [`MAX_STATUS_QUERY`] ids,
    /// [`STATUS_QUERIES_AT_ONCE`] of them in flight together (each waits a round trip);
    /// objects it has never heard of are absent from the answer.
    pub fn statuses(&self, ids: &[ObjectId]) -> Result<HashMap<ObjectId, ObjectStatus>> {
        let mut all = HashMap::new();
        let queries: Vec<&[ObjectId]> = ids.chunks(MAX_STATUS_QUERY).collect();
        for some in queries.chunks(STATUS_QUERIES_AT_ONCE) {
            let answers = std::thread::scope(|s| {
                let asking: Vec<_> = some
                    .iter()
                    .map(|chunk| s.spawn(|| self.status_query(chunk)))
                    .collect();
                asking
                    .into_iter()
                    .map(|a| a.join().expect("a status query panicked"))
                    .collect::<Vec<_>>()
            });
            for answer in answers {
                all.extend(answer?);
            }
        }
        Ok(all)
    }

    /// Announces that `n` connections are about to be opened: uploads from now on wait for
    /// them (see [`OpeningConnections::open`]). Call it before the uploads can start, and open
    /// them on another thread.
    pub fn opening_connections(&self, n: usize) -> OpeningConnections<'_> {
        *self.opening.lock() += 1;
        OpeningConnections { client: self, n }
    }

    /// Waits while connections are being opened (at most a timeout): the prepare pass starts
    /// beside the handshakes, and its first uploads take the connections they open.
    fn wait_for_connections(&self) {
        let mut opening = self.opening.lock();
        let deadline = std::time::Instant::now() + self.timeout;
        while *opening > 0 {
            if self.opened.wait_until(&mut opening, deadline).timed_out() {
                return;
            }
        }
    }

    /// One status query of at most [`MAX_STATUS_QUERY`] ids.
    fn status_query(&self, ids: &[ObjectId]) -> Result<HashMap<ObjectId, ObjectStatus>> {
        let url = self.url("/v1/objects/status");
        let query = StatusQuery { ids: ids.to_vec() };
        let r = self.send(url.clone(), self.http.post(&url).json(&query))?;
        let answer: HashMap<String, ObjectStatus> = Self::json(&url, r)?;
        Ok(answer
            .into_iter()
            .filter_map(|(id, s)| Some((id.parse().ok()?, s)))
            .collect())
    }

    pub fn seal(
        &self,
        id: ObjectId,
        batch: &str,
        parts: Vec<PartRef>,
        manifest: &[u8],
    ) -> Result<()> {
        let url = self.url(&format!("/v1/objects/{id}"));
        let seal = Seal {
            batch: batch.to_string(),
            parts,
            manifest: base64::engine::general_purpose::STANDARD.encode(manifest),
        };
        self.send(url.clone(), self.http.put(&url).json(&seal))
            .map(drop)
    }

    /// Seals a batch: `objects` are all of it, each sealed or delivered, and `inventory` its
    /// sealed inventory. With `wait`, the relay waits that long for objects still being
    /// uploaded before it refuses the seal.
    pub fn seal_batch(
        &self,
        batch: &str,
        objects: &[ObjectId],
        inventory: &[u8],
        wait: Option<Duration>,
    ) -> Result<()> {
        let mut url = self.url(&format!("/v1/batches/{batch}"));
        if let Some(wait) = wait {
            url.push_str(&format!("?wait_ms={}", wait.as_millis()));
        }
        // A `BatchSeal`, written without a base64 copy of the inventory beside the JSON: at
        // 100 000 files each would be tens of MB.
        #[derive(Serialize)]
        struct Body<'a> {
            objects: &'a [ObjectId],
            #[serde(serialize_with = "base64_of")]
            inventory: &'a [u8],
        }
        fn base64_of<S: serde::Serializer>(
            bytes: &&[u8],
            to: S,
        ) -> std::result::Result<S::Ok, S::Error> {
            let text = base64::display::Base64Display::new(
                bytes,
                &base64::engine::general_purpose::STANDARD,
            );
            to.collect_str(&text)
        }
        let mut body = Vec::with_capacity(objects.len() * 35 + inventory.len() * 4 / 3 + 64);
        serde_json::to_writer(&mut body, &Body { objects, inventory }).expect("serialises");
        let request = self.http.put(&url).header(CONTENT_TYPE, "application/json");
        self.send(url.clone(), request.body(body)).map(drop)
    }

    /// Objects of complete batches; with `open`, also sealed objects of batches still being
    /// sent (each says whether its batch is sealed).
    pub fn ready(&self, open: bool) -> Result<Vec<ReadyObject>> {
        self.ready_after(open, None).map(|(ready, _)| ready)
    }

    /// The ready objects and the relay's seal generation (`None` from a relay that predates
    /// long polls). With `after = Some((generation, wait))`, the relay answers once something
    /// was sealed since the listing that gave `generation`, or after `wait`.
    pub fn ready_after(
        &self,
        open: bool,
        after: Option<(u64, Duration)>,
    ) -> Result<(Vec<ReadyObject>, Option<u64>)> {
        let mut url = self.url(&format!("/v1/ready?open={open}"));
        if let Some((generation, wait)) = after {
            url.push_str(&format!("&after={generation}&wait_ms={}", wait.as_millis()));
        }
        let r = self.send(url.clone(), self.http.get(&url))?;
        let generation = r
            .headers()
            .get(crate::api::GENERATION_HEADER)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        Ok((Self::json(&url, r)?, generation))
    }

    /// The sealed inventory of a sealed batch, read up to `max + 1` bytes; `None` if the
    /// relay holds none for it.
    pub fn inventory(&self, site: &str, batch: &str, max: u64) -> Result<Option<Vec<u8>>> {
        let url = self.url(&format!("/v1/sites/{site}/batches/{batch}/inventory"));
        match self.send(url.clone(), self.http.get(&url)) {
            Ok(r) => Self::body(&url, r, max).map(Some),
            Err(e) if e.status == Some(StatusCode::NOT_FOUND.as_u16()) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A sealed manifest, read up to `max + 1` bytes.
    pub fn manifest(&self, site: &str, id: ObjectId, max: u64) -> Result<Vec<u8>> {
        let url = self.url(&format!("/v1/sites/{site}/objects/{id}/manifest"));
        let r = self.send(url.clone(), self.http.get(&url))?;
        Self::body(&url, r, max)
    }

    /// A sealed part, read up to `length + 1` bytes (`length`: what its signed manifest says).
    pub fn part(&self, site: &str, id: ObjectId, index: u32, length: u64) -> Result<Vec<u8>> {
        let url = self.url(&format!("/v1/sites/{site}/objects/{id}/parts/{index}"));
        let r = self.send(url.clone(), self.http.get(&url))?;
        Self::body(&url, r, length)
    }

    /// The site this edge's token belongs to.
    pub fn site(&self) -> Result<String> {
        let url = self.url("/v1/site");
        let r = self.send(url.clone(), self.http.get(&url))?;
        Self::json::<SiteAnswer>(&url, r).map(|a| a.site)
    }

    /// The core's receipts the relay keeps for one of this edge's batches, decoded (each
    /// still to be verified: the relay may have forged or swapped them).
    pub fn receipts(&self, batch: &str) -> Result<Vec<Vec<u8>>> {
        let url = self.url(&format!("/v1/batches/{batch}/receipts"));
        let r = self.send(url.clone(), self.http.get(&url))?;
        let answer: Receipts = Self::json(&url, r)?;
        Ok(answer
            .receipts
            .iter()
            .filter_map(|r| base64::engine::general_purpose::STANDARD.decode(r).ok())
            .collect())
    }

    /// Cancels one of this edge's batches: the relay deletes those of `objects` not delivered,
    /// and the batch's seal.
    /// Gives up the open (never sealed) uploads of `objects`: the relay removes their parts
    /// and leaves any sealed or delivered one as it is.
    pub fn abandon_open(&self, objects: &[ObjectId]) -> Result<Cancelled> {
        let url = self.url("/v1/objects/abandon");
        let mut dropped = Cancelled {
            objects: 0,
            bytes: 0,
        };
        for ids in objects.chunks(MAX_STATUS_QUERY) {
            let query = StatusQuery { ids: ids.to_vec() };
            let r = self.send(url.clone(), self.http.post(&url).json(&query))?;
            let some: Cancelled = Self::json(&url, r)?;
            dropped.objects += some.objects;
            dropped.bytes += some.bytes;
        }
        Ok(dropped)
    }

    pub fn cancel_batch(&self, batch: &str, objects: &[ObjectId]) -> Result<Cancelled> {
        let url = self.url(&format!("/v1/batches/{batch}/cancel"));
        let body = BatchAck {
            objects: objects.to_vec(),
            receipt: None,
        };
        let r = self.send(url.clone(), self.http.post(&url).json(&body))?;
        Self::json(&url, r)
    }

    /// Acknowledges the delivery of a whole batch with the core's signed `receipt`: the relay
    /// keeps the receipt for the edge, stops listing all of `objects` at once, then deletes
    /// them.
    pub fn ack_batch(
        &self,
        site: &str,
        batch: &str,
        objects: &[ObjectId],
        receipt: Option<&[u8]>,
    ) -> Result<()> {
        let url = self.url(&format!("/v1/sites/{site}/batches/{batch}/ack"));
        let body = BatchAck {
            objects: objects.to_vec(),
            receipt: receipt.map(|r| base64::engine::general_purpose::STANDARD.encode(r)),
        };
        self.send(url.clone(), self.http.post(&url).json(&body))
            .map(drop)
    }

    /// Reports a manifest that does not decrypt, verify or name its object: the relay drops it
    /// and reopens the object for the edge to seal again.
    pub fn reject_manifest(&self, site: &str, id: ObjectId) -> Result<()> {
        let url = self.url(&format!("/v1/sites/{site}/objects/{id}/manifest/reject"));
        self.send(url.clone(), self.http.post(&url)).map(drop)
    }

    pub fn reject(&self, site: &str, id: ObjectId, index: u32) -> Result<()> {
        let url = self.url(&format!(
            "/v1/sites/{site}/objects/{id}/parts/{index}/reject"
        ));
        self.send(url.clone(), self.http.post(&url)).map(drop)
    }
}

/// The relay's URL must be `https://HOST[:PORT][/PATH]`.
fn check_url(url: &str) -> anyhow::Result<()> {
    let parsed = reqwest::Url::parse(url).map_err(|e| {
        anyhow::anyhow!("relay URL {url:?} is not a URL ({e}): give --relay https://HOST:PORT")
    })?;
    if parsed.scheme() != "https" {
        anyhow::bail!(
            "relay URL must start with https:// (got {url:?}): the relay speaks only HTTPS; \
             use the address `forte relay` printed"
        );
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        anyhow::bail!("relay URL {url:?} names no host: give --relay https://HOST:PORT");
    }
    Ok(())
}

/// Whether a failed connection was closed by the other side before a TLS handshake finished:
/// what a relay at its connection cap does (it closes a connection as soon as it accepts it).
fn closed_at_once(what: &str) -> bool {
    ["tls handshake eof", "reset by peer", "unexpected eof"]
        .iter()
        .any(|sign| what.to_ascii_lowercase().contains(sign))
}

/// The causes behind a transport error, which reqwest keeps out of its own message.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = String::new();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(&format!(": {c}"));
        cause = c.source();
    }
    out
}

/// The TLS error behind a transport error, if any. `std::io::Error::source` skips the error it
/// wraps (and I/O errors wrap I/O errors wrapping the TLS error), so the walk goes into each
/// I/O error's wrapped error instead.
fn tls_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(tls) = c.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        cause = match c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => c.source(),
        };
    }
    None
}

/// What to change when TLS failed for a reason no retry can fix; `None` for the others.
fn tls_advice(tls: &rustls::Error) -> Option<String> {
    use rustls::{CertificateError, Error};
    match tls {
        Error::InvalidCertificate(CertificateError::Other(other)) => {
            match other.0.downcast_ref::<FingerprintMismatch>() {
                Some(m) => Some(format!(
                    "the relay's certificate does not match --relay-fingerprint (the relay has \
                     {}, the pin is {}): check the fingerprint `forte relay` printed at start",
                    m.found, m.pinned
                )),
                None => Some(format!(
                    "the relay's certificate is refused ({tls}): check --relay-ca or \
                     --relay-fingerprint"
                )),
            }
        }
        Error::InvalidCertificate(_) => Some(format!(
            "the relay's certificate is refused ({tls}): check --relay-ca and the host name in \
             --relay, or pin the certificate with --relay-fingerprint"
        )),
        Error::InvalidMessage(_) | Error::PeerIncompatible(_) => Some(format!(
            "no TLS relay answered at this address ({tls}): check that --relay is the https:// \
             address `forte relay` printed"
        )),
        _ => None,
    }
}

/// `bytes` (read up to `max + 1`) as JSON, refused if longer than `max`.
fn decode<T: serde::de::DeserializeOwned>(url: &str, bytes: &[u8], max: u64) -> Result<T> {
    let refused = |message: String| RelayError {
        url: url.to_string(),
        status: None,
        message,
        permanent: false,
        held: None,
    };
    if bytes.len() as u64 > max {
        return Err(refused(format!(
            "the answer is longer than {max} bytes, the most a JSON answer may hold"
        )));
    }
    serde_json::from_slice(bytes).map_err(|e| refused(format!("unexpected answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::{start, RelayConfig, RunningRelay};

    const EDGE: &str = "edge-token-0123456789abcdef";

    /// A JSON answer is taken up to its bound exactly, and one byte more is refused as too
    /// long (not misread as a truncated document).
    #[test]
    fn a_json_answer_is_bounded_exactly() {
        let doc = br#"{"site":"site-a"}"#;
        let max = doc.len() as u64;
        let site: SiteAnswer = decode("u", doc, max).unwrap();
        assert_eq!(site.site, "site-a");
        let longer = [doc.as_slice(), b" "].concat();
        let e = decode::<SiteAnswer>("u", &longer, max).unwrap_err();
        assert!(e.message.contains("longer than 17 bytes"), "{}", e.message);
    }

    #[test]
    fn a_body_may_take_as_long_as_the_slowest_limit_it_shares_makes_it() {
        let mib16 = 16 << 20;
        // No limit: the usual timeout.
        assert_eq!(paced_for(mib16, 8, None, None), Duration::ZERO);
        // Its own 10 MB/s shared by 8 uploads: 13.4 s for 16 MiB.
        let own = paced_for(mib16, 8, Some(10e6), None);
        assert_eq!(own.as_millis(), 13_421);
        // The relay holds the site to 1 MB/s (many sites at once): that is the slowest, and
        // what the timeout must allow for, not its own 10 MB/s.
        let shared = paced_for(mib16, 8, Some(10e6), Some(1e6));
        assert_eq!(shared.as_millis(), 134_217);
        assert_eq!(paced_for(mib16, 8, None, Some(1e6)), shared);
    }

    fn relay(dir: &std::path::Path) -> RunningRelay {
        std::fs::create_dir_all(dir).unwrap();
        let tokens = dir.join("tokens.toml");
        std::fs::write(
            &tokens,
            format!("[[token]]\ntoken = \"{EDGE}\"\nrole = \"edge\"\nsite = \"site-a\"\n"),
        )
        .unwrap();
        start(RelayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            store: dir.join("store").into(),
            tokens,
            tls_cert: None,
            tls_key: None,
            tls_names: vec!["localhost".into(), "127.0.0.1".into()],
            quota_per_site: None,
            expire_open_after: None,
            fair_shares: true,
            shutdown_grace: std::time::Duration::from_secs(1),
            connections: Default::default(),
            body_memory: crate::server::DEFAULT_BODY_MEMORY,
        })
        .unwrap()
    }

    fn client(url: String, token: &str, trust: RelayTrust) -> anyhow::Result<RelayClient> {
        RelayClient::new(
            &RelayEndpoint {
                url,
                token: token.into(),
                trust,
            },
            Duration::from_secs(5),
        )
    }

    fn answered(status: u16) -> RelayError {
        RelayError::answered(
            "https://relay/v1/ready".into(),
            StatusCode::from_u16(status).unwrap(),
            ApiError {
                error: "what the relay said".into(),
                held: None,
            },
        )
    }

    #[test]
    fn only_answers_that_can_heal_are_transient() {
        for status in [500, 502, 503, 504, 507, 429, 408] {
            assert!(answered(status).is_transient(), "{status}");
        }
        for status in [400, 401, 403, 404, 405, 409, 413, 422] {
            assert!(!answered(status).is_transient(), "{status}");
        }
        let refused = answered(401);
        assert!(refused.message.contains("--token-file"), "{refused}");
        assert!(answered(403).message.contains("core token"));
    }

    #[test]
    fn a_refused_connection_is_transient() {
        // A port nobody listens on (bound, then released).
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let c = client(
            format!("https://{addr}"),
            EDGE,
            RelayTrust::Fingerprint("00".repeat(32)),
        )
        .unwrap();
        let err = c.ready(false).unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert_eq!(err.status, None);
        // The URL once, in front; not again in reqwest's own message.
        assert_eq!(
            err.to_string().matches(&addr.to_string()).count(),
            1,
            "{err}"
        );
    }

    #[test]
    fn a_certificate_that_is_not_the_pinned_one_is_permanent() {
        let tmp = tempfile::tempdir().unwrap();
        let relay = relay(tmp.path());
        let c = client(relay.url(), EDGE, RelayTrust::Fingerprint("00".repeat(32))).unwrap();
        let err = c.statuses(&[ObjectId::random()]).unwrap_err();
        assert!(!err.is_transient(), "{err}");
        assert!(err.message.contains("--relay-fingerprint"), "{err}");
        assert!(err.message.contains(&relay.fingerprint), "{err}");
        // The right pin, a wrong token: 401, for good, with what to check.
        let c = client(
            relay.url(),
            "not-a-token-0123456789",
            RelayTrust::Fingerprint(relay.fingerprint.clone()),
        )
        .unwrap();
        let err = c.statuses(&[ObjectId::random()]).unwrap_err();
        assert_eq!(err.status, Some(401));
        assert!(
            !err.is_transient() && err.message.contains("--token-file"),
            "{err}"
        );
    }

    #[test]
    fn an_upload_after_a_refused_token_fails_with_the_refusal_not_a_broken_pipe() {
        let tmp = tempfile::tempdir().unwrap();
        let relay = relay(tmp.path());
        let c = client(
            relay.url(),
            "not-a-token-0123456789",
            RelayTrust::Fingerprint(relay.fingerprint.clone()),
        )
        .unwrap();
        c.opening_connections(2).open();
        // The relay refuses the token before it reads a body; a body this large is still being
        // written when the refusal closes the connection.
        let body = vec![7u8; 16 << 20];
        let sha256 = forte_format::seal::sha256_hex(&body);
        for index in 0..5 {
            let err = c
                .put_part(ObjectId::random(), index, &body, &sha256)
                .unwrap_err();
            assert_eq!(err.status, Some(401), "{err}");
            assert!(!err.is_transient(), "{err}");
        }
    }

    #[test]
    fn a_certificate_from_an_unknown_ca_is_permanent() {
        let tmp = tempfile::tempdir().unwrap();
        let (relay, other) = (relay(&tmp.path().join("a")), relay(&tmp.path().join("b")));
        let c = client(
            relay.url(),
            EDGE,
            RelayTrust::CaFile(other.cert_path.clone()),
        )
        .unwrap();
        let err = c.statuses(&[ObjectId::random()]).unwrap_err();
        assert!(!err.is_transient(), "{err}");
        assert!(err.message.contains("certificate"), "{err}");
    }

    #[test]
    fn a_url_that_is_not_https_is_refused_before_connecting() {
        let trust = RelayTrust::Fingerprint("00".repeat(32));
        for url in [
            "http://127.0.0.1:8443",
            "ftp://relay",
            "relay.example:8443",
            "https://",
        ] {
            let err = client(url.into(), EDGE, trust.clone()).err().expect(url);
            let text = format!("{err:#}");
            assert!(text.contains("https://"), "{url}: {text}");
        }
        assert!(client("https://relay.example:8443/".into(), EDGE, trust).is_ok());
    }
}
