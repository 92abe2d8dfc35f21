//! Durable file-system operations: the points where written data becomes safe on disk.
//!
//! forte writes many files and makes them durable in one step with `syncfs(2)` (one flush of
//! the file system) rather than an `fsync` per file, which costs a disk round trip each and
//! dominates when files are small.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use anyhow::{Context, Result};

/// Flushes every dirty page and inode of the file system holding `path` to stable storage.
pub fn syncfs(path: &Path) -> Result<()> {
    let dir = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: syncfs takes a descriptor, which `dir` keeps open for the duration of the call.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot flush {} to disk", path.display()));
    }
    Ok(())
}
