//! The store in an S3-compatible bucket: each key an object under the bucket's prefix. A PUT is
//! durable once answered, so nothing needs flushing; create-only writes are `If-None-Match: *`,
//! and every body carries its CRC64-NVME (`x-amz-checksum-crc64nvme`), which the server checks
//! before it keeps the body (the store above has checked its SHA-256 before writing it).
//! Deleting many prefixes lists them concurrently and removes every key in bulk
//! (`DeleteObjects`). Several relay processes may serve one bucket: the store above keeps no
//! state the bucket does not hold, beyond caches it checks against listings.

use forte_bucket::Bucket;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path as Key;
use object_store::{ObjectMeta, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use std::io::Read;
use std::path::{Path, PathBuf};

use super::backend::{io_error, Backend, Entry, Reader};
use super::{Result, StoreError};

pub struct BucketBackend {
    bucket: Bucket,
    /// Where uploads arrive before they are sent on: a directory of this store's own in the
    /// system's temporary directory (`$TMPDIR`), removed with it.
    spool: PathBuf,
}

/// A body larger than this is sent on in parts of this size (a multipart upload), so that no
/// more than [`PARTS_AT_ONCE`] of them are in memory at once.
const SEND_PART_BYTES: usize = 16 << 20;
const PARTS_AT_ONCE: usize = 2;

impl BucketBackend {
    pub fn new(bucket: Bucket) -> Self {
        // Its own even beside another store of the same process (tests run several).
        let mut suffix = [0u8; 4];
        let _ = getrandom::getrandom(&mut suffix);
        let name = format!(
            "forte-relay-spool-{}-{}",
            std::process::id(),
            hex::encode(suffix)
        );
        let spool = std::env::temp_dir().join(name);
        Self { bucket, spool }
    }

    /// Sends the file at `from` to `key` in parts, completing the upload only if every byte
    /// was read and sent.
    fn send_in_parts(&self, from: &Path, key: &Key, what: &str) -> Result<()> {
        let mut file = std::fs::File::open(from).map_err(|e| io_error(what, e))?;
        let store = self.bucket.store();
        request("put");
        self.bucket.block_on(async {
            let upload = store
                .put_multipart(key)
                .await
                .map_err(|e| self.failed(what, key, e))?;
            let mut writer =
                object_store::WriteMultipart::new_with_chunk_size(upload, SEND_PART_BYTES);
            let mut buffer = vec![0u8; SEND_PART_BYTES];
            let sent = loop {
                let n = match file.read(&mut buffer) {
                    Ok(0) => break Ok(()),
                    Ok(n) => n,
                    Err(e) => break Err(io_error(what, format!("{}: {e}", from.display()))),
                };
                if let Err(e) = writer.wait_for_capacity(PARTS_AT_ONCE).await {
                    break Err(self.failed(what, key, e));
                }
                writer.write(&buffer[..n]);
            };
            match sent {
                Ok(()) => writer
                    .finish()
                    .await
                    .map(drop)
                    .map_err(|e| self.failed(what, key, e)),
                Err(e) => {
                    let _ = writer.abort().await;
                    Err(e)
                }
            }
        })
    }

    fn key(&self, key: &str) -> Key {
        self.bucket.key(key)
    }

    fn entry(&self, m: &ObjectMeta) -> Entry {
        Entry {
            key: self.bucket.relative(&m.location).to_string(),
            size: m.size,
            modified: m.last_modified.timestamp().max(0) as u64,
            version: m.e_tag.clone(),
        }
    }

    fn failed(&self, what: &str, key: &Key, e: object_store::Error) -> StoreError {
        ::metrics::counter!("forte_relay_bucket_failures_total").increment(1);
        io_error(what, format!("{}: {e}", self.bucket.shown(key)))
    }

    fn put_with(&self, key: &str, bytes: &[u8], mode: PutMode, what: &str) -> Result<bool> {
        let key = self.key(key);
        let options = PutOptions {
            mode,
            ..Default::default()
        };
        let payload = PutPayload::from(bytes.to_vec());
        let store = self.bucket.store();
        request("put");
        match self.bucket.block_on(store.put_opts(&key, payload, options)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(self.failed(what, &key, e)),
        }
    }
}

impl Drop for BucketBackend {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.spool);
    }
}

/// A bucket object's body read from blocking code, one chunk of the client's stream at a time.
struct StreamReader {
    runtime: tokio::runtime::Handle,
    stream: futures_util::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>,
    chunk: bytes::Bytes,
}

impl Read for StreamReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.runtime.block_on(self.stream.next()) {
                Some(Ok(chunk)) => self.chunk = chunk,
                Some(Err(e)) => return Err(std::io::Error::other(e)),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.chunk.len());
        out[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

/// Listings in flight together when many prefixes are deleted.
const LISTINGS_AT_ONCE: usize = 16;

/// Keys one bulk deletion (`DeleteObjects`) takes at most, as S3 defines it.
const BULK_DELETE_KEYS: usize = 1000;

/// Counts a request to the bucket by operation (a listing counts once, however many pages):
/// what the relay costs an S3 service, and where its time goes.
fn request(op: &'static str) {
    ::metrics::counter!("forte_relay_bucket_requests_total", "op" => op).increment(1);
}

impl Backend for BucketBackend {
    fn put(&self, key: &str, bytes: &[u8], what: &str) -> Result<()> {
        self.put_with(key, bytes, PutMode::Overwrite, what)
            .map(drop)
    }

    fn put_new(&self, key: &str, bytes: &[u8], what: &str) -> Result<bool> {
        self.put_with(key, bytes, PutMode::Create, what)
    }

    fn spool_dir(&self, _key: &str) -> PathBuf {
        self.spool.clone()
    }

    fn put_file(&self, key: &str, spooled: &Path, what: &str) -> Result<()> {
        let sent = match std::fs::metadata(spooled) {
            Ok(m) if m.len() <= SEND_PART_BYTES as u64 => std::fs::read(spooled)
                .map_err(|e| io_error(what, format!("{}: {e}", spooled.display())))
                .and_then(|bytes| self.put(key, &bytes, what)),
            Ok(_) => self.send_in_parts(spooled, &self.key(key), what),
            Err(e) => Err(io_error(what, format!("{}: {e}", spooled.display()))),
        };
        let _ = std::fs::remove_file(spooled);
        sent
    }

    fn open(&self, key: &str, what: &str) -> Result<Option<Reader>> {
        let key = self.key(key);
        request("get");
        let store = self.bucket.store();
        match self.bucket.block_on(store.get(&key)) {
            Ok(got) => {
                let length = got.meta.size;
                let reader = StreamReader {
                    runtime: self.bucket.handle(),
                    stream: got.into_stream(),
                    chunk: bytes::Bytes::new(),
                };
                Ok(Some((Box::new(reader), length)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.failed(what, &key, e)),
        }
    }

    fn get(&self, key: &str, what: &str) -> Result<Option<Vec<u8>>> {
        let key = self.key(key);
        request("get");
        let store = self.bucket.store();
        let got = self
            .bucket
            .block_on(async { store.get(&key).await?.bytes().await });
        match got {
            Ok(bytes) => Ok(Some(bytes.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.failed(what, &key, e)),
        }
    }

    fn exists(&self, key: &str, what: &str) -> Result<bool> {
        let key = self.key(key);
        request("head");
        match self.bucket.block_on(self.bucket.store().head(&key)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.failed(what, &key, e)),
        }
    }

    fn any_under(&self, prefix: &str, what: &str) -> Result<bool> {
        Ok(!self.children(prefix, what)?.is_empty())
    }

    fn delete(&self, key: &str, what: &str) -> Result<()> {
        let key = self.key(key);
        request("delete");
        match self.bucket.block_on(self.bucket.store().delete(&key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.failed(what, &key, e)),
        }
    }

    fn delete_under(&self, prefixes: &[String], what: &str) -> Result<Vec<Entry>> {
        let store = self.bucket.store();
        let listings = prefixes.iter().map(|prefix| {
            let key = self.key(prefix);
            request("list");
            async move {
                let listed: Vec<ObjectMeta> = store.list(Some(&key)).try_collect().await?;
                Ok::<_, object_store::Error>(listed)
            }
        });
        let listed: Vec<ObjectMeta> = self
            .bucket
            .block_on(
                futures_util::stream::iter(listings)
                    .buffer_unordered(LISTINGS_AT_ONCE)
                    .try_concat(),
            )
            .map_err(|e| self.failed(what, &self.key(&prefixes.join(", ")), e))?;
        if listed.is_empty() {
            return Ok(Vec::new());
        }
        for _ in listed.chunks(BULK_DELETE_KEYS) {
            request("delete");
        }
        let keys: Vec<object_store::Result<Key>> =
            listed.iter().map(|m| Ok(m.location.clone())).collect();
        let deleted = self.bucket.block_on(
            store
                .delete_stream(futures_util::stream::iter(keys).boxed())
                .try_for_each(|_| futures_util::future::ready(Ok(()))),
        );
        match deleted {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(self.failed(what, &listed[0].location, e)),
        }
        Ok(listed.iter().map(|m| self.entry(m)).collect())
    }

    fn list(&self, prefix: &str, what: &str) -> Result<Vec<Entry>> {
        let key = self.key(prefix);
        request("list");
        let listed: Vec<ObjectMeta> = self
            .bucket
            .block_on(self.bucket.store().list(Some(&key)).try_collect())
            .map_err(|e| self.failed(what, &key, e))?;
        Ok(listed.iter().map(|m| self.entry(m)).collect())
    }

    fn children(&self, prefix: &str, what: &str) -> Result<Vec<String>> {
        let key = self.key(prefix);
        request("list");
        let listed = self
            .bucket
            .block_on(self.bucket.store().list_with_delimiter(Some(&key)))
            .map_err(|e| self.failed(what, &key, e))?;
        Ok(listed
            .common_prefixes
            .iter()
            .chain(listed.objects.iter().map(|m| &m.location))
            .filter_map(|k| k.filename().map(str::to_string))
            .collect())
    }

    fn flush(&self, _what: &str) -> Result<()> {
        Ok(())
    }

    fn location(&self) -> String {
        self.bucket.shown(&self.bucket.key(""))
    }

    fn shared(&self) -> bool {
        true
    }
}
