//! A blocking client of the relay, for the worker threads of `send` and `pull`.

use std::time::Duration;

use base64::Engine;
use forte_format::ObjectId;
use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::StatusCode;

use std::collections::HashMap;

use crate::api::{
    ApiError, BatchSeal, ObjectStatus, PartRef, ReadyObject, Seal, StatusQuery, MAX_STATUS_QUERY,
    SHA256_HEADER,
};
use crate::tls::{client_config, RelayTrust};

/// A failed request: the HTTP status if the relay answered, and what it said.
#[derive(Debug, thiserror::Error)]
#[error("relay {url}: {message}")]
pub struct RelayError {
    pub url: String,
    pub status: Option<u16>,
    pub message: String,
}

impl RelayError {
    /// Worth trying again later: no answer (network, timeout), a server error, or a full relay.
    pub fn is_transient(&self) -> bool {
        match self.status {
            None => true,
            Some(s) => s >= 500 || s == 429 || s == 408,
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

pub struct RelayClient {
    http: Client,
    base: String,
    token: String,
}

impl RelayClient {
    pub fn new(endpoint: &RelayEndpoint, timeout: Duration) -> anyhow::Result<Self> {
        let tls = client_config(&endpoint.trust)?;
        let http = Client::builder()
            .tls_backend_preconfigured(tls)
            .connect_timeout(Duration::from_secs(10))
            .timeout(timeout)
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the HTTPS client: {e}"))?;
        Ok(Self {
            http,
            base: endpoint.url.trim_end_matches('/').to_string(),
            token: endpoint.token.clone(),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn send(&self, url: String, request: RequestBuilder) -> Result<Response> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .map_err(|e| RelayError {
                url: url.clone(),
                status: None,
                message: format!("{e}{}", source_chain(&e)),
            })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let message = response
            .json::<ApiError>()
            .map(|e| e.error)
            .unwrap_or_else(|_| status.canonical_reason().unwrap_or("error").to_string());
        Err(RelayError {
            url,
            status: Some(status.as_u16()),
            message: format!("{status}: {message}"),
        })
    }

    fn body(url: &str, response: Response) -> Result<Vec<u8>> {
        response
            .bytes()
            .map(|b| b.to_vec())
            .map_err(|e| RelayError {
                url: url.to_string(),
                status: None,
                message: format!("reading the answer: {e}"),
            })
    }

    fn json<T: serde::de::DeserializeOwned>(url: &str, response: Response) -> Result<T> {
        response.json().map_err(|e| RelayError {
            url: url.to_string(),
            status: None,
            message: format!("unexpected answer: {e}"),
        })
    }

    /// Uploads a sealed part; the relay checks `sha256` before answering.
    pub fn put_part(&self, id: ObjectId, index: u32, sealed: &[u8], sha256: &str) -> Result<()> {
        let url = self.url(&format!("/v1/objects/{id}/parts/{index}"));
        self.send(
            url.clone(),
            self.http
                .put(&url)
                .header(SHA256_HEADER, sha256)
                .body(sealed.to_vec()),
        )
        .map(drop)
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

    /// What the relay holds of many objects, in queries of at most [`MAX_STATUS_QUERY`] ids;
    /// objects it has never heard of are absent from the answer.
    pub fn statuses(&self, ids: &[ObjectId]) -> Result<HashMap<ObjectId, ObjectStatus>> {
        let url = self.url("/v1/objects/status");
        let mut all = HashMap::new();
        for chunk in ids.chunks(MAX_STATUS_QUERY) {
            let query = StatusQuery {
                ids: chunk.to_vec(),
            };
            let r = self.send(url.clone(), self.http.post(&url).json(&query))?;
            let answer: HashMap<String, ObjectStatus> = Self::json(&url, r)?;
            all.extend(
                answer
                    .into_iter()
                    .filter_map(|(id, s)| Some((id.parse().ok()?, s))),
            );
        }
        Ok(all)
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

    /// Declares a batch complete: `objects` are all of it, each sealed or delivered.
    pub fn seal_batch(&self, batch: &str, objects: &[ObjectId]) -> Result<()> {
        let url = self.url(&format!("/v1/batches/{batch}"));
        let body = BatchSeal {
            objects: objects.to_vec(),
        };
        self.send(url.clone(), self.http.put(&url).json(&body))
            .map(drop)
    }

    /// Objects of complete batches; with `open`, also sealed objects of batches still being
    /// sent (each says whether its batch is sealed).
    pub fn ready(&self, open: bool) -> Result<Vec<ReadyObject>> {
        let url = self.url(if open {
            "/v1/ready?open=true"
        } else {
            "/v1/ready"
        });
        let r = self.send(url.clone(), self.http.get(&url))?;
        Self::json(&url, r)
    }

    pub fn manifest(&self, site: &str, id: ObjectId) -> Result<Vec<u8>> {
        let url = self.url(&format!("/v1/sites/{site}/objects/{id}/manifest"));
        let r = self.send(url.clone(), self.http.get(&url))?;
        Self::body(&url, r)
    }

    pub fn part(&self, site: &str, id: ObjectId, index: u32) -> Result<Vec<u8>> {
        let url = self.url(&format!("/v1/sites/{site}/objects/{id}/parts/{index}"));
        let r = self.send(url.clone(), self.http.get(&url))?;
        Self::body(&url, r)
    }

    pub fn ack(&self, site: &str, id: ObjectId) -> Result<()> {
        let url = self.url(&format!("/v1/sites/{site}/objects/{id}"));
        self.send(url.clone(), self.http.delete(&url)).map(drop)
    }

    pub fn reject(&self, site: &str, id: ObjectId, index: u32) -> Result<()> {
        let url = self.url(&format!(
            "/v1/sites/{site}/objects/{id}/parts/{index}/reject"
        ));
        self.send(url.clone(), self.http.post(&url)).map(drop)
    }
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
