//! An S3-compatible bucket and a prefix in it (`s3://BUCKET/PREFIX`), through arrow-rs's
//! `object_store` (request signing, retries, multipart uploads), never hand-written S3.
//!
//! Endpoint and credentials come as S3 tools take them: `AWS_ENDPOINT_URL` (or
//! `AWS_ENDPOINT`), `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_REGION` (or `AWS_DEFAULT_REGION`). An `http://` endpoint (a store on the local network)
//! is allowed.
//!
//! Callers are blocking code (the puller's copy, the relay's store on its blocking threads):
//! a bucket has a small runtime of its own and [`Bucket::block_on`] runs one call on it.

use std::future::Future;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use object_store::aws::{AmazonS3Builder, Checksum};
use object_store::path::Path as Key;
use object_store::ObjectStore;

#[cfg(feature = "test-server")]
pub mod test_server;

/// Where the S3 server is and the keys for it: each one given here is taken over the
/// environment's (`[s3]` in the configuration file, or a test's own server).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub endpoint: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub region: Option<String>,
}

/// A bucket and a prefix in it, with a client for the endpoint the environment names.
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// Always `Some` but in `drop`.
    runtime: Option<tokio::runtime::Runtime>,
    name: String,
    prefix: String,
    endpoint: String,
}

impl Bucket {
    /// Whether `text` names a bucket (`s3://…`).
    pub fn is_url(text: &str) -> bool {
        text.starts_with("s3://")
    }

    /// Opens `s3://BUCKET/PREFIX` and checks at once that the bucket can be listed with the
    /// credentials given, so that a wrong name or key fails before anything is done.
    pub fn open(url: &str, given: &Credentials) -> Result<Self> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| anyhow!("{url} is not an S3 URL (s3://BUCKET/PREFIX)"))?;
        let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if name.is_empty() {
            bail!("{url} names no bucket: give s3://BUCKET or s3://BUCKET/PREFIX");
        }
        let endpoint = given.endpoint.clone().or_else(|| {
            ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
                .iter()
                .find_map(|v| std::env::var(v).ok())
        });
        // Fails only when a default is installed already, which is then the one in use.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Every body carries its CRC64-NVME, which the server checks before it keeps it: the
        // bytes it keeps are the bytes sent. What proves contents is forte's own SHA-256 (the
        // relay's check of each part before it stores it, the core's after it pulls; a copy's
        // over the whole file), so the body is not hashed again here: SHA-256 as the checksum,
        // and a signed payload hashed once more for the signature, cost the relay and the S3
        // server 0.7 CPU-seconds for 318 MB (docs/scale.md). TLS guards the body on the wire.
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(name)
            .with_checksum_algorithm(Checksum::CRC64NVME)
            .with_unsigned_payload(true);
        if let Some(key) = &given.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &given.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        if let Some(region) = &given.region {
            builder = builder.with_region(region);
        }
        if let Some(endpoint) = &endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        let store = builder.build().with_context(|| {
            format!("cannot use {url}: set AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION for it")
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("forte-s3")
            .enable_all()
            .build()
            .context("starting the S3 client's runtime")?;
        let this = Self {
            store: Arc::new(store),
            runtime: Some(runtime),
            name: name.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            endpoint: endpoint.unwrap_or_else(|| "AWS".into()),
        };
        this.block_on(this.store.list_with_delimiter(Some(&this.key(""))))
            .map_err(|e| refused(e, &this.name, &this.endpoint))?;
        Ok(this)
    }

    /// The object name of `path` (relative, `/`-separated) under the prefix.
    pub fn key(&self, path: &str) -> Key {
        match (self.prefix.as_str(), path) {
            ("", p) => Key::from(p),
            (p, "") => Key::from(p),
            (p, t) => Key::from(format!("{p}/{t}")),
        }
    }

    /// `key` relative to the prefix again (for names a listing returns).
    pub fn relative<'k>(&self, key: &'k Key) -> &'k str {
        let key = key.as_ref();
        if self.prefix.is_empty() {
            return key;
        }
        key.strip_prefix(self.prefix.as_str())
            .map_or(key, |rest| rest.trim_start_matches('/'))
    }

    /// `s3://BUCKET/KEY`, for messages.
    pub fn shown(&self, key: &Key) -> String {
        format!("s3://{}/{key}", self.name)
    }

    pub fn store(&self) -> &dyn ObjectStore {
        self.store.as_ref()
    }

    /// Runs one call of the client to its end. From blocking code only: never on a thread that
    /// drives asynchronous tasks.
    pub fn block_on<F: Future>(&self, call: F) -> F::Output {
        let runtime = self
            .runtime
            .as_ref()
            .expect("a bucket's runtime lives as long as it");
        runtime.block_on(call)
    }
}

impl Bucket {
    /// The client's runtime, for a stream read from blocking code a piece at a time.
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("a bucket's runtime lives as long as it")
            .handle()
            .clone()
    }
}

impl Drop for Bucket {
    fn drop(&mut self) {
        // Without waiting: the owner (a relay's store) may be dropped on an asynchronous
        // thread, where waiting for the runtime's threads is not allowed.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// What to do when the store refused to list the bucket, with what it said.
fn refused(e: object_store::Error, bucket: &str, endpoint: &str) -> anyhow::Error {
    let text = e.to_string();
    let fix = if text.contains("InvalidBucketName") {
        format!("{bucket} is not a valid bucket name (3 to 63 lower-case letters, digits, dots and hyphens)")
    } else if text.contains("NoSuchBucket") || matches!(e, object_store::Error::NotFound { .. }) {
        format!("bucket {bucket} does not exist at {endpoint}: create it, or name another")
    } else if text.contains("AccessDenied")
        || text.contains("InvalidAccessKeyId")
        || text.contains("SignatureDoesNotMatch")
        || matches!(
            e,
            object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
        )
    {
        format!("{endpoint} refused the credentials for bucket {bucket}: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    } else {
        format!("cannot reach bucket {bucket} at {endpoint}: check AWS_ENDPOINT_URL")
    };
    let said = match (text.find("<Code>"), text.find("</Code>")) {
        (Some(start), Some(end)) if start < end => text[start + 6..end].to_string(),
        _ => text.chars().take(300).collect(),
    };
    anyhow!("{fix} (the store said: {said})")
}
