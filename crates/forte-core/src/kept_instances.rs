//! The instances the core delivered, kept beside the destination as well as in the catalogue,
//! so that replay protection outlives the catalogue: a core given a new, restored or moved
//! catalogue, or a new worker on the same destination, still knows every instance it
//! delivered there, refuses it again and never delivers an older one of the same batch.
//!
//! One file per batch, `DEST/.forte-custody/SITE/SHA256(BATCH NAME).json`: keyed by the site
//! and the batch name the edge signed (never the relay's batch id, which the relay chooses),
//! written to a temporary name, flushed and renamed before the relay may be told of the
//! delivery. Nothing in it is secret: the catalogue holds the same rows.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use forte_catalog::{BatchKey, Earlier, History, InstanceRow, Role};
use serde::{Deserialize, Serialize};

/// The record's directory under the destination.
pub const CUSTODY_DIR: &str = ".forte-custody";

/// The `format` of a record file.
const FORMAT: &str = "forte-delivered/1";

/// The largest record file read: some 100 000 instances of one batch.
const MAX_RECORD_BYTES: u64 = 256 << 20;

/// The records of the instances delivered into one destination.
pub(super) struct KeptInstances {
    /// The destination; the records are under its `.forte-custody`.
    dest: PathBuf,
}

/// One batch's record file.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    format: String,
    site: String,
    batch: String,
    instances: Vec<Kept>,
}

/// One delivered instance, as [`InstanceRow`] holds it.
#[derive(Serialize, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Kept {
    instance: String,
    sequence: i64,
    batch_key: String,
    content: String,
    objects: Vec<String>,
    sealed_at: i64,
    recorded_at: i64,
    receipt: Option<String>,
    epoch: String,
    epoch_from: i64,
    generation: i64,
    /// The earlier instances it supersedes: instance, sequence, content.
    supersedes: Vec<(String, i64, String)>,
}

impl Kept {
    fn of(row: &InstanceRow) -> Self {
        let h = &row.history;
        Self {
            instance: row.instance.clone(),
            sequence: row.sequence,
            batch_key: row.batch_key.to_string(),
            content: row.content.clone(),
            objects: row.objects.clone(),
            sealed_at: row.sealed_at,
            recorded_at: row.recorded_at,
            receipt: row.receipt.clone(),
            epoch: h.epoch.clone(),
            epoch_from: h.epoch_from,
            generation: h.generation,
            supersedes: h
                .supersedes
                .iter()
                .map(|e| (e.instance.clone(), e.sequence, e.content.clone()))
                .collect(),
        }
    }

    fn row(self, site: &str) -> InstanceRow {
        InstanceRow {
            role: Role::Core,
            site: site.to_string(),
            instance: self.instance,
            sequence: self.sequence,
            batch_key: BatchKey::parse(&self.batch_key),
            content: self.content,
            objects: self.objects,
            sealed_at: self.sealed_at,
            recorded_at: self.recorded_at,
            receipt: self.receipt,
            history: History {
                epoch: self.epoch,
                epoch_from: self.epoch_from,
                generation: self.generation,
                supersedes: self
                    .supersedes
                    .into_iter()
                    .map(|(instance, sequence, content)| Earlier {
                        instance,
                        sequence,
                        content,
                    })
                    .collect(),
            },
        }
    }
}

impl KeptInstances {
    /// The records of the destination `dest`.
    pub fn at(dest: &Path) -> Self {
        Self {
            dest: dest.to_path_buf(),
        }
    }

    /// The file of `batch` (its signed name) of `site`.
    fn path(&self, site: &str, batch: &str) -> PathBuf {
        use sha2::{Digest, Sha256};
        let name = hex::encode(Sha256::digest(batch.as_bytes()));
        self.dest
            .join(CUSTODY_DIR)
            .join(site)
            .join(format!("{name}.json"))
    }

    /// Every instance of `batch` of `site` delivered into this destination, oldest first;
    /// none if it has no record. An unreadable record is an error: a core that cannot tell
    /// a replay must not deliver.
    pub fn of(&self, site: &str, batch: &str) -> Result<Vec<InstanceRow>> {
        let path = self.path(site, batch);
        let Some(record) = read(&path)? else {
            return Ok(Vec::new());
        };
        if record.site != site || record.batch != batch {
            anyhow::bail!(
                "{} records batch {:?} of site {}, not batch {batch:?} of site {site}: it was moved or edited (delete it only if that destination never held this batch)",
                path.display(),
                record.batch,
                record.site
            );
        }
        Ok(record.instances.into_iter().map(|k| k.row(site)).collect())
    }

    /// Adds `row`, an instance of `batch` just delivered, to the batch's record, durably,
    /// before the relay may be told. Once is enough: an instance recorded already is kept as
    /// it was (its first receipt is the one).
    pub fn add(&self, batch: &str, row: &InstanceRow) -> Result<()> {
        // Its directory made without following a link on the way (one would take the
        // records wherever it points), and held while the record is read and written again:
        // two workers with catalogues of their own could otherwise each drop the other's line.
        let dir = Path::new(CUSTODY_DIR).join(&row.site);
        let dir = forte_fs::create_dirs_under(&self.dest, &dir)
            .with_context(|| format!("cannot keep the record of batch {batch:?}"))?;
        let _held = forte_fs::DirLock::take(&dir)
            .with_context(|| format!("cannot keep the record of batch {batch:?}"))?;
        let path = self.path(&row.site, batch);
        let mut record = read(&path)?.unwrap_or_else(|| Record {
            format: FORMAT.into(),
            site: row.site.clone(),
            batch: batch.to_string(),
            instances: Vec::new(),
        });
        if record.instances.iter().any(|k| k.instance == row.instance) {
            return Ok(());
        }
        record.instances.push(Kept::of(row));
        write(&path, &record)
    }
}

/// The record at `path`, `None` if there is none.
fn read(path: &Path) -> Result<Option<Record>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Not through a link, and without waiting on a FIFO: only a regular file is a record.
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => anyhow::bail!(
            "{} is a symbolic link, not a record of delivered instances: move it away",
            path.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let meta = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        anyhow::bail!(
            "{} is not a regular file, so not a record of delivered instances: move it away",
            path.display()
        );
    }
    let mut text = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut text)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if text.len() as u64 > MAX_RECORD_BYTES {
        anyhow::bail!("{} is over {MAX_RECORD_BYTES} bytes", path.display());
    }
    let record: Record = serde_json::from_slice(&text)
        .with_context(|| format!("{} is not a record of delivered instances", path.display()))?;
    if record.format != FORMAT {
        anyhow::bail!(
            "{} is of format {:?}; this forte reads {FORMAT:?}",
            path.display(),
            record.format
        );
    }
    Ok(Some(record))
}

/// Writes `record` at `path` whole or not at all: a temporary name beside it, flushed, then
/// renamed, and the directory flushed.
fn write(path: &Path, record: &Record) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().expect("a record is in its site's directory");
    let temp = dir.join(format!(
        ".{}.{}",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("record"),
        std::process::id()
    ));
    let bytes = serde_json::to_vec(record).expect("a record serialises");
    // Made new, never opened through what is there: a link planted at the temporary name
    // (it is predictable) would have the record written wherever it points. One left by a
    // killed worker, or planted, is removed first (a link goes, not what it points to); one
    // put back meanwhile fails the write, and the batch is acknowledged at the next try.
    let _ = std::fs::remove_file(&temp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .and_then(|mut f| {
            f.write_all(&bytes)?;
            f.sync_all()
        });
    written.with_context(|| format!("cannot write {}", temp.display()))?;
    std::fs::rename(&temp, path)
        .with_context(|| format!("cannot move {} into place", path.display()))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot flush {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(instance: &str, generation: i64) -> InstanceRow {
        InstanceRow {
            role: Role::Core,
            site: "mine-7".into(),
            instance: instance.into(),
            sequence: generation,
            batch_key: BatchKey::core("mine-7", "0a1b"),
            content: "c".into(),
            objects: vec!["0f".into()],
            sealed_at: 5,
            recorded_at: 6,
            receipt: Some("{\"r\":1}".into()),
            history: History {
                epoch: "e".into(),
                epoch_from: 1,
                generation,
                supersedes: vec![Earlier {
                    instance: "i0".into(),
                    sequence: 0,
                    content: "c0".into(),
                }],
            },
        }
    }

    /// What is added is read back, once, by the batch's signed name; another batch's name,
    /// or a record moved under it, is not taken for it.
    #[test]
    fn a_delivered_instance_is_read_back_by_its_site_and_batch_name() {
        let dest = tempfile::tempdir().unwrap();
        let kept = KeptInstances::at(dest.path());
        assert!(kept.of("mine-7", "run 1/x").unwrap().is_empty());
        kept.add("run 1/x", &row("i1", 1)).unwrap();
        kept.add("run 1/x", &row("i1", 1)).unwrap();
        kept.add("run 1/x", &row("i2", 2)).unwrap();
        let read = kept.of("mine-7", "run 1/x").unwrap();
        assert_eq!(read, [row("i1", 1), row("i2", 2)]);
        assert!(kept.of("mine-7", "run 2").unwrap().is_empty());
        assert!(kept.of("ship-2", "run 1/x").unwrap().is_empty());
        std::fs::create_dir_all(dest.path().join(CUSTODY_DIR).join("ship-2")).unwrap();
        std::fs::rename(
            kept.path("mine-7", "run 1/x"),
            kept.path("ship-2", "run 1/x"),
        )
        .unwrap();
        let moved = kept.of("ship-2", "run 1/x").unwrap_err().to_string();
        assert!(moved.contains("moved or edited"), "{moved}");
        std::fs::write(kept.path("mine-7", "b"), b"{").unwrap();
        assert!(
            kept.of("mine-7", "b").is_err(),
            "a damaged record is an error"
        );
    }

    /// A link planted at the record's temporary name is not written through; a link or a
    /// FIFO at the record itself is refused, named, at once (a FIFO opened to read waited for
    /// a writer for ever).
    #[test]
    fn the_record_is_never_written_or_read_through_a_link_or_a_fifo() {
        let (dest, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let kept = KeptInstances::at(dest.path());
        kept.add("run", &row("i1", 1)).unwrap();
        let path = kept.path("mine-7", "run");
        let name = path.file_name().unwrap().to_str().unwrap();
        let temp = path.with_file_name(format!(".{name}.{}", std::process::id()));
        let victim = elsewhere.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, &temp).unwrap();
        kept.add("run", &row("i2", 2)).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(kept.of("mine-7", "run").unwrap().len(), 2);

        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let err = kept.of("mine-7", "run").unwrap_err().to_string();
        assert!(err.contains("is a symbolic link"), "{err}");
        std::fs::remove_file(&path).unwrap();
        let fifo = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a path this test owns.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let err = kept.of("mine-7", "run").unwrap_err().to_string();
        assert!(err.contains("is not a regular file"), "{err}");
    }

    /// Workers with catalogues of their own adding instances of one batch at once each keep
    /// theirs: the record is rewritten by one at a time. Seen failing without the lock:
    /// instances lost, or a write failing on another's temporary file.
    #[test]
    fn instances_added_at_once_are_all_kept() {
        let dest = tempfile::tempdir().unwrap();
        for round in 0..20 {
            let batch = format!("run {round}");
            std::thread::scope(|s| {
                for i in 0..6 {
                    let (dest, batch) = (dest.path(), &batch);
                    s.spawn(move || {
                        let id = format!("i{i}");
                        KeptInstances::at(dest).add(batch, &row(&id, 1)).unwrap();
                    });
                }
            });
            let read = KeptInstances::at(dest.path()).of("mine-7", &batch).unwrap();
            assert_eq!(read.len(), 6, "round {round}: {read:?}");
        }
    }

    /// A link where the records go (put there by whoever can write the destination) is not
    /// followed: the record is refused, naming it, and nothing is written where it points.
    #[test]
    fn a_link_where_the_records_go_is_not_followed() {
        let (dest, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::os::unix::fs::symlink(elsewhere.path(), dest.path().join(CUSTODY_DIR)).unwrap();
        let kept = KeptInstances::at(dest.path());
        let err = format!("{:#}", kept.add("run", &row("i1", 1)).unwrap_err());
        assert!(err.contains(".forte-custody is a symbolic link"), "{err}");
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }
}
