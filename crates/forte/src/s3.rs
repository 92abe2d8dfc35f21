//! An S3-compatible bucket as a destination (`pull --copy-to s3://BUCKET/PREFIX`), through
//! arrow-rs's `object_store` (request signing, multipart uploads, retries), never hand-written
//! S3.
//!
//! A file is written as a multipart upload fed from the delivered (verified) file while its
//! SHA-256 is computed; the upload is completed only if that hash is the manifest's, and
//! aborted otherwise, so no object appears under its final name before it is whole and
//! verified. The hash is recorded on the object (metadata `sha256`, `x-amz-meta-sha256`), which
//! is how a second pull knows an object already there is the same file.
//!
//! Endpoint and credentials come as S3 tools take them: `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT`),
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` (or
//! `AWS_DEFAULT_REGION`). An `http://` endpoint (a store on the local network) is allowed.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use object_store::{
    Attribute, Attributes, GetOptions, ObjectStore, PutMultipartOptions, WriteMultipart,
};
use sha2::{Digest, Sha256};

use forte_restore::Placed;

/// Bytes read from the delivered file and sent per part (S3's smallest part is 5 MiB).
const PART_BYTES: usize = 8 << 20;
/// Parts of one file uploading at once.
const PARTS_AT_ONCE: usize = 4;
/// The object metadata that holds the file's SHA-256.
const SHA256_METADATA: &str = "sha256";

/// A bucket and a prefix in it, with a client for the endpoint the environment names.
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    runtime: tokio::runtime::Runtime,
    bucket: String,
    prefix: String,
}

impl Bucket {
    /// Whether `text` names an S3 destination.
    pub fn is_url(text: &str) -> bool {
        text.starts_with("s3://")
    }

    /// Opens `s3://BUCKET/PREFIX` and checks at once that the bucket can be listed with the
    /// credentials given, so that a wrong name or key fails before anything is pulled.
    pub fn open(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| anyhow!("{url} is not an S3 URL (s3://BUCKET/PREFIX)"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            bail!("{url} names no bucket: give s3://BUCKET or s3://BUCKET/PREFIX");
        }
        let endpoint = ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
            .iter()
            .find_map(|v| std::env::var(v).ok());
        forte_relay::tls::install_default_provider();
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Some(endpoint) = &endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        let store = builder
            .build()
            .with_context(|| format!("cannot use {url}: set AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION for it"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the S3 client's runtime")?;
        let this = Self {
            store: Arc::new(store),
            runtime,
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
        };
        let at = endpoint.as_deref().unwrap_or("AWS");
        this.runtime
            .block_on(this.store.list_with_delimiter(Some(&this.key(""))))
            .map_err(|e| refused(e, &this.bucket, at))?;
        Ok(this)
    }

    /// The object name of `target` (a layout path) under the prefix.
    fn key(&self, target: &str) -> Key {
        match (self.prefix.as_str(), target) {
            ("", t) => Key::from(t),
            (p, "") => Key::from(p),
            (p, t) => Key::from(format!("{p}/{t}")),
        }
    }

    /// Copies each of `placed` from `dest` into the bucket under its layout path, each
    /// completed only once its bytes hashed to the manifest's SHA-256. An object already there
    /// with that SHA-256 is kept; one with other contents is an error, and nothing is
    /// overwritten. Returns the files copied.
    pub fn replicate(&self, dest: &Path, placed: &[Placed]) -> Result<usize> {
        let mut copied = 0;
        for p in placed {
            let key = self.key(&p.target);
            let shown = format!("s3://{}/{key}", self.bucket);
            match self.held_sha256(&key)? {
                Some(held) if held == p.sha256 => continue,
                Some(_) => bail!("{shown} exists with other contents; refusing to overwrite it"),
                None => {}
            }
            self.upload(&dest.join(&p.target), &key, &p.sha256)
                .with_context(|| format!("cannot copy {} to {shown}", p.target))?;
            copied += 1;
        }
        Ok(copied)
    }

    /// The SHA-256 recorded on the object at `key`, `None` if there is no object; an object
    /// without one (not written by forte) counts as other contents.
    fn held_sha256(&self, key: &Key) -> Result<Option<String>> {
        let head = GetOptions {
            head: true,
            ..Default::default()
        };
        match self.runtime.block_on(self.store.get_opts(key, head)) {
            Ok(found) => Ok(Some(
                found
                    .attributes
                    .get(&Attribute::Metadata(SHA256_METADATA.into()))
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
            )),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot look up s3://{}/{key}", self.bucket)),
        }
    }

    /// Uploads the file at `from` to `key` in parts, completing the upload only if the bytes
    /// sent hash to `sha256`.
    fn upload(&self, from: &Path, key: &Key, sha256: &str) -> Result<()> {
        let mut file =
            std::fs::File::open(from).with_context(|| format!("cannot open {}", from.display()))?;
        let mut attributes = Attributes::new();
        attributes.insert(
            Attribute::Metadata(SHA256_METADATA.into()),
            sha256.to_string().into(),
        );
        let options = PutMultipartOptions {
            attributes,
            ..Default::default()
        };
        self.runtime.block_on(async {
            let upload = self.store.put_multipart_opts(key, options).await?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
            let (mut hasher, mut buffer) = (Sha256::new(), vec![0u8; PART_BYTES]);
            let sent = loop {
                let n = match file.read(&mut buffer) {
                    Ok(0) => break Ok(hex::encode(hasher.finalize_reset())),
                    Ok(n) => n,
                    Err(e) => break Err(anyhow!("cannot read {}: {e}", from.display())),
                };
                hasher.update(&buffer[..n]);
                if let Err(e) = writer.wait_for_capacity(PARTS_AT_ONCE).await {
                    break Err(e.into());
                }
                writer.write(&buffer[..n]);
            };
            match sent {
                Ok(found) if found == sha256 => writer.finish().await.map(drop).map_err(Into::into),
                Ok(found) => {
                    let _ = writer.abort().await;
                    Err(anyhow!(
                        "{} hashed to {found} while sending, not {sha256}: the upload was aborted",
                        from.display()
                    ))
                }
                Err(e) => {
                    let _ = writer.abort().await;
                    Err(e)
                }
            }
        })
    }
}

/// What went wrong opening a bucket, with what to do.
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
    // The store's answer, without the XML body around its error code.
    let said = match (text.find("<Code>"), text.find("</Code>")) {
        (Some(start), Some(end)) if start < end => text[start + 6..end].to_string(),
        _ => text.chars().take(300).collect(),
    };
    anyhow!("{fix} (the store said: {said})")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// versitygw serving a temporary directory with one bucket, `bkt` (the integration tests in
    /// tests/it/s3.rs run the same server through `pull`). `None`, loudly, outside CI without it.
    fn server(root: &Path) -> Option<std::process::Child> {
        let binary = std::env::var_os("FORTE_TEST_VERSITYGW")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join("go/bin/versitygw")))
            .filter(|p| p.exists());
        let Some(binary) = binary else {
            assert!(
                std::env::var("CI").is_err(),
                "versitygw not found: .ci/run installs it"
            );
            eprintln!("SKIPPED: no versitygw");
            return None;
        };
        std::fs::create_dir_all(root.join("bkt")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new(binary)
            .args(["--access", "k", "--secret", "secret-0123456789", "--port"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("posix")
            .arg(root)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        std::env::set_var("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"));
        std::env::set_var("AWS_ACCESS_KEY_ID", "k");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "secret-0123456789");
        std::env::set_var("AWS_REGION", "us-east-1");
        Some(child)
    }

    /// An upload whose bytes do not hash to the expected SHA-256 is aborted: no object under
    /// its name, nothing of it in the bucket. One that does is completed with its SHA-256.
    #[test]
    fn an_upload_is_completed_only_when_its_bytes_match_the_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let Some(mut s3) = server(&dir.path().join("s3")) else {
            return;
        };
        let bucket = Bucket::open("s3://bkt/pre").unwrap();
        let file = dir.path().join("f.bin");
        let bytes: Vec<u8> = (0..(20u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&file, &bytes).unwrap();
        let right = hex::encode(Sha256::digest(&bytes));
        let wrong = hex::encode(Sha256::digest(b"other"));
        let key = bucket.key("x/f.bin");
        let e = bucket.upload(&file, &key, &wrong).unwrap_err().to_string();
        assert!(e.contains("the upload was aborted"), "{e}");
        assert_eq!(bucket.held_sha256(&key).unwrap(), None);
        assert!(!dir.path().join("s3/bkt/pre/x/f.bin").exists());
        bucket.upload(&file, &key, &right).unwrap();
        assert_eq!(bucket.held_sha256(&key).unwrap(), Some(right));
        assert_eq!(
            std::fs::read(dir.path().join("s3/bkt/pre/x/f.bin")).unwrap(),
            bytes
        );
        let _ = s3.kill();
        let _ = s3.wait();
    }
}
