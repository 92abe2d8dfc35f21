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
//! Endpoint and credentials: see `forte_bucket`.

use std::io::Read;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use forte_bucket::{Bucket, Credentials};
use object_store::path::Path as Key;
use object_store::{
    Attribute, Attributes, GetOptions, ObjectStoreExt, PutMultipartOptions, WriteMultipart,
};
use sha2::{Digest, Sha256};

use forte_restore::Placed;

/// Bytes read from the delivered file and sent per part (S3's smallest part is 5 MiB).
const PART_BYTES: usize = 8 << 20;
/// Parts of one file uploading at once.
const PARTS_AT_ONCE: usize = 4;
/// The object metadata that holds the file's SHA-256.
const SHA256_METADATA: &str = "sha256";

/// A bucket that receives the second copy of every delivered file.
pub struct BucketWriter {
    bucket: Bucket,
}

impl BucketWriter {
    /// Opens `s3://BUCKET/PREFIX`, its credentials checked now.
    pub fn open(url: &str, credentials: &Credentials) -> Result<Self> {
        Bucket::open(url, credentials).map(|bucket| Self { bucket })
    }

    /// Copies each of `placed` from `dest` into the bucket under its layout path, each
    /// completed only once its bytes hashed to the manifest's SHA-256. An object already there
    /// with that SHA-256 is kept; one with other contents is an error, and nothing is
    /// overwritten. Returns the files copied.
    pub fn replicate(&self, dest: &Path, placed: &[Placed], may_replace: bool) -> Result<usize> {
        let mut copied = 0;
        for p in placed {
            let key = self.bucket.key(&p.target);
            let shown = self.bucket.shown(&key);
            match self.held_sha256(&key)? {
                Some(held) if held == p.sha256 => continue,
                Some(held) if may_replace => self.keep_earlier_version(&key, &p.target, &held)?,
                Some(_) => bail!("{shown} exists with other contents; refusing to overwrite it"),
                None => {}
            }
            self.upload(&dest.join(&p.target), &key, &p.sha256)
                .with_context(|| format!("cannot copy {} to {shown}", p.target))?;
            copied += 1;
        }
        Ok(copied)
    }

    /// Copies the object at `key` (the file `target`, of SHA-256 `held`) to
    /// `.forte-replaced/TARGET.SHA256` under the bucket's prefix before a later version of its
    /// batch replaces it: the bucket's own copy, so its bytes stay where the operator finds
    /// them, named by their hash so that each earlier version has a name of its own.
    fn keep_earlier_version(&self, key: &Key, target: &str, held: &str) -> Result<()> {
        let name = format!("{}/{target}.{held}", crate::deliver::REPLACED_DIR);
        let kept = self.bucket.key(&name);
        self.bucket
            .block_on(self.bucket.store().copy(key, &kept))
            .with_context(|| {
                format!(
                    "cannot keep {} as {} before replacing it",
                    self.bucket.shown(key),
                    self.bucket.shown(&kept)
                )
            })
    }

    /// The SHA-256 recorded on the object at `key`, `None` if there is no object; an object
    /// without one (not written by forte) counts as other contents.
    fn held_sha256(&self, key: &Key) -> Result<Option<String>> {
        let head = GetOptions {
            head: true,
            ..Default::default()
        };
        match self
            .bucket
            .block_on(self.bucket.store().get_opts(key, head))
        {
            Ok(found) => Ok(Some(
                found
                    .attributes
                    .get(&Attribute::Metadata(SHA256_METADATA.into()))
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
            )),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot look up {}", self.bucket.shown(key))),
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
        self.bucket.block_on(async {
            let upload = self.bucket.store().put_multipart_opts(key, options).await?;
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
#[cfg(test)]
mod tests {
    use forte_bucket::test_server::S3Server;

    use super::*;

    /// versitygw serving a temporary directory with one bucket, `bkt` (the integration tests in
    /// tests/it/s3.rs run the same server through `pull`). `None`, loudly, outside CI without it.
    #[test]
    fn an_upload_is_completed_only_when_its_bytes_match_the_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let Some(s3) = S3Server::start(&dir.path().join("s3"), &["bkt"]) else {
            return;
        };
        let copy = BucketWriter::open("s3://bkt/pre", &s3.credentials()).unwrap();
        let file = dir.path().join("f.bin");
        let bytes: Vec<u8> = (0..(20u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&file, &bytes).unwrap();
        let right = hex::encode(Sha256::digest(&bytes));
        let wrong = hex::encode(Sha256::digest(b"other"));
        let key = copy.bucket.key("x/f.bin");
        let e = copy.upload(&file, &key, &wrong).unwrap_err().to_string();
        assert!(e.contains("the upload was aborted"), "{e}");
        assert_eq!(copy.held_sha256(&key).unwrap(), None);
        assert!(!dir.path().join("s3/bkt/pre/x/f.bin").exists());
        copy.upload(&file, &key, &right).unwrap();
        assert_eq!(copy.held_sha256(&key).unwrap(), Some(right));
        assert_eq!(
            std::fs::read(dir.path().join("s3/bkt/pre/x/f.bin")).unwrap(),
            bytes
        );
    }
}
