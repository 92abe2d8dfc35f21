//! Where a relay's store is ([`Location`]: a directory, or a bucket) and the [`Backend`] that
//! keeps its keys there.

use std::path::{Path, PathBuf};

use forte_bucket::{Bucket, Credentials};

use super::bucket::BucketBackend;
use super::dir::DirBackend;
use super::Backend;

/// Where a relay's store is: a directory, or `s3://BUCKET/PREFIX` with the credentials for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Dir(PathBuf),
    Bucket {
        url: String,
        credentials: Credentials,
    },
}

impl Location {
    /// `s3://…` is a bucket, with `credentials` over the environment's; anything else a directory.
    pub fn parse(text: &str, credentials: Credentials) -> Self {
        if Bucket::is_url(text) {
            Self::Bucket {
                url: text.to_string(),
                credentials,
            }
        } else {
            Self::Dir(PathBuf::from(text))
        }
    }
}

impl From<&Path> for Location {
    fn from(dir: &Path) -> Self {
        Self::Dir(dir.to_path_buf())
    }
}

impl From<PathBuf> for Location {
    fn from(dir: PathBuf) -> Self {
        Self::Dir(dir)
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dir(dir) => write!(f, "{}", dir.display()),
            Self::Bucket { url, .. } => f.write_str(url),
        }
    }
}

/// The backend at `location`; a directory is created unless `inspect`.
pub(super) fn backend_at(location: &Location, inspect: bool) -> anyhow::Result<Box<dyn Backend>> {
    Ok(match location {
        Location::Dir(root) => {
            let sites = root.join("sites");
            if inspect {
                anyhow::ensure!(
                    sites.is_dir(),
                    "{} is not a relay store (it has no sites/ directory): give the directory `forte relay --store` uses",
                    root.display()
                );
            } else {
                std::fs::create_dir_all(&sites).map_err(|e| {
                    anyhow::anyhow!("cannot create relay store {}: {e}", sites.display())
                })?;
            }
            let dir = DirBackend::new(root);
            if !inspect {
                dir.remove_tmp();
            }
            Box::new(dir)
        }
        Location::Bucket { url, credentials } => {
            Box::new(BucketBackend::new(Bucket::open(url, credentials)?))
        }
    })
}
