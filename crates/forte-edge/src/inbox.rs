//! The inbox: each subdirectory is one batch, complete when marked ready or unchanged for a
//! while.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use forte_daemon::signals;

/// The marker file that declares a batch complete without waiting for it to settle.
pub const READY_MARKER: &str = ".ready";

/// A batch directory of the inbox.
pub struct Batch {
    pub name: String,
    pub dir: PathBuf,
}

/// The inbox at one moment: batches ready to send, and names of those still changing.
#[derive(Default)]
pub struct Inbox {
    pub ready: Vec<Batch>,
    pub waiting: Vec<String>,
}

/// Batches (subdirectories of the inbox, except hidden ones) that are complete: marked ready, or unchanged for
/// `settle`. Returns them in name order, and the names of those still changing.
pub fn ready_batches(inbox: &Path, settle: Duration) -> Result<Inbox> {
    let mut entries: Vec<_> = std::fs::read_dir(inbox)
        .with_context(|| format!("cannot list inbox {}", inbox.display()))?
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot list inbox {}", inbox.display()))?;
    entries.sort_by_key(|e| e.file_name());
    let mut inbox = Inbox::default();
    for entry in entries {
        let dir = entry.path();
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            tracing::warn!("skipping {}: batch names must be UTF-8", dir.display());
            continue;
        };
        // Hidden directories are where tools (forte ingest among them) write before they
        // rename a finished batch into place.
        if name.starts_with('.') {
            continue;
        }
        // A name with a line break or an escape would forge lines in logs and on terminals
        // wherever it is shown (found by the outside review of issue 44).
        if name.chars().any(char::is_control) {
            tracing::warn!("skipping batch {name:?}: a batch name must not hold control characters (line breaks, escapes); rename the directory");
            continue;
        }
        // Nothing but a marker is nothing to send, and nothing the core could acknowledge: an
        // empty batch was said "acknowledged; source deleted" without reaching the core
        // (found by the outside review of issue 44). It is taken once something is in it.
        let mut entries = std::fs::read_dir(&dir)
            .with_context(|| format!("cannot list batch {}", dir.display()))?;
        if entries.all(|e| e.is_ok_and(|e| e.file_name() == READY_MARKER)) {
            tracing::debug!("batch {name}: empty, nothing to send");
            continue;
        }
        let quiet_since = newest_change(&dir)?
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .unwrap_or(Duration::MAX);
        if dir.join(READY_MARKER).exists() || quiet_since >= settle {
            inbox.ready.push(Batch { name, dir });
        } else {
            inbox.waiting.push(name);
        }
    }
    Ok(inbox)
}

fn newest_change(dir: &Path) -> Result<Option<SystemTime>> {
    let mut newest = std::fs::symlink_metadata(dir)?.modified().ok();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        let t = if meta.is_dir() {
            newest_change(&entry.path())?
        } else {
            meta.modified().ok()
        };
        newest = newest.max(t);
    }
    Ok(newest)
}

/// When the batch's ready marker was last touched, in microseconds since the epoch.
pub(super) fn marker_time_us(dir: &Path) -> Option<i64> {
    let modified = std::fs::metadata(dir.join(READY_MARKER))
        .ok()?
        .modified()
        .ok()?;
    micros_since_epoch(modified)
}

/// When the batch in `dir` arrived whole, in microseconds since the epoch: its ready marker's
/// time, or without one the last change under it (it was sent once unchanged for `settle`).
pub(super) fn arrival_us(dir: &Path) -> Option<i64> {
    marker_time_us(dir).or_else(|| micros_since_epoch(newest_change(dir).ok()??))
}

fn micros_since_epoch(t: SystemTime) -> Option<i64> {
    let since = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_micros()).ok()
}

/// Removes the empty directories under `dir` (not `dir` itself), deepest first.
pub(super) fn prune_empty_dirs(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            prune_empty_dirs(&entry.path());
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

/// This process's hold on an inbox: one `send` per inbox, so two never plan the same batch
/// from the same catalogue (which sealed batches twice and left parts at the relay that did not
/// match their manifests). An advisory `flock` on the inbox directory itself, released by the
/// kernel however the process ends, and nothing written into the inbox (a read-only inbox can
/// be locked too); the holder's PID, for the message, is the kernel's (`/proc/locks`).
#[derive(Debug)]
pub struct InboxLock {
    _dir: std::fs::File,
}

impl InboxLock {
    /// [`InboxLock::take`] for a daemon: an inbox that does not exist yet (mounted later) is
    /// waited for, looked at every `interval`, and said once; `None` when a stop was asked for
    /// meanwhile.
    pub fn take_when_there(inbox: &Path, interval: Duration) -> Result<Option<Self>> {
        let mut said = false;
        while !inbox.is_dir() {
            if signals::stop_requested() {
                return Ok(None);
            }
            if !said {
                tracing::warn!(
                    "inbox {} does not exist yet: waiting for it (looked at every {} s)",
                    inbox.display(),
                    interval.as_secs()
                );
                said = true;
            }
            signals::sleep_unless_stopped(interval);
        }
        Self::take(inbox).map(Some)
    }

    /// Takes `inbox`'s lock, or fails at once naming the process that holds it.
    pub fn take(inbox: &Path) -> Result<Self> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        if !inbox.is_dir() {
            anyhow::bail!(
                "inbox {} is not a directory: create it, or give the inbox's path",
                inbox.display()
            );
        }
        let dir = std::fs::File::open(inbox)
            .with_context(|| format!("cannot open the inbox {}", inbox.display()))?;
        // SAFETY: flock on a file descriptor this function owns; no memory is shared.
        let locked = unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let holder = dir
                .metadata()
                .ok()
                .and_then(|m| flock_holder(m.ino()))
                .map_or_else(|| "unknown".to_string(), |pid| pid.to_string());
            anyhow::bail!(
                "another forte send (PID {holder}) is sending inbox {}: one send per inbox; stop it first, or wait for it to end",
                inbox.display()
            );
        }
        Ok(Self { _dir: dir })
    }
}

/// The process holding an `flock` on the file with inode `ino`, from `/proc/locks` (lines
/// like `1: FLOCK  ADVISORY  WRITE 4242 08:01:131090 0 EOF`).
fn flock_holder(ino: u64) -> Option<u32> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (kind, pid, file) = (fields.get(1)?, fields.get(4)?, fields.get(5)?);
        let inode = file.rsplit(':').next()?.parse::<u64>().ok()?;
        (*kind == "FLOCK" && inode == ino).then(|| pid.parse().ok())?
    })
}

#[cfg(test)]
mod lock_tests {
    use super::*;

    #[test]
    fn a_second_lock_on_an_inbox_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = InboxLock::take(dir.path()).unwrap();
        let e = InboxLock::take(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(&format!("PID {}", std::process::id())) && e.contains("one send per inbox"),
            "{e}"
        );
        drop(first);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "nothing written into the inbox"
        );
        InboxLock::take(dir.path()).expect("free once the holder let go");
    }
}
