//! What names one version of a file on disk.

/// A file's device, inode, size, mtime and ctime to the nanosecond. Equal before and after a
/// file was read means nothing wrote to it, replaced it or changed its metadata in between,
/// short of a change within the same tick of the kernel's coarse clock, which stamps ctime
/// (see [`FileIdentity::settled`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    device: u64,
    inode: u64,
    size: u64,
    mtime: Timestamp,
    ctime: Timestamp,
}

/// A time as the kernel keeps it: seconds since the epoch, then nanoseconds within the second
/// (ordered so).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Timestamp {
    seconds: i64,
    nanoseconds: i64,
}

impl FileIdentity {
    pub fn of(m: &std::fs::Metadata) -> FileIdentity {
        use std::os::unix::fs::MetadataExt;
        FileIdentity {
            device: m.dev(),
            inode: m.ino(),
            size: m.size(),
            mtime: Timestamp {
                seconds: m.mtime(),
                nanoseconds: m.mtime_nsec(),
            },
            ctime: Timestamp {
                seconds: m.ctime(),
                nanoseconds: m.ctime_nsec(),
            },
        }
    }

    /// Whether any change to the file from now on is sure to move its ctime: the kernel's
    /// coarse clock, which stamps it, is past this ctime, and the ctime has sub-second
    /// precision (a file system that keeps whole seconds, or coarser, could stamp a change
    /// within the same second alike).
    pub fn settled(&self) -> bool {
        self.ctime.nanoseconds != 0 && coarse_now() > self.ctime
    }

    /// Waits until [`FileIdentity::settled`] holds for every file of `identities`, for at
    /// most `longest` (a tick of the coarse clock, a few ms, when the clock is sane; a ctime
    /// in the future, after the clock was set back, would otherwise be waited for).
    pub fn wait_settled<'a>(
        identities: impl IntoIterator<Item = &'a FileIdentity>,
        longest: std::time::Duration,
    ) {
        let Some(latest) = identities.into_iter().map(|i| i.ctime).max() else {
            return;
        };
        let started = std::time::Instant::now();
        while coarse_now() <= latest && started.elapsed() < longest {
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
    }
}

/// The kernel's coarse real-time clock, the one it stamps file times with.
fn coarse_now() -> Timestamp {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut now) };
    Timestamp {
        seconds: now.tv_sec,
        nanoseconds: now.tv_nsec,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    /// A file's identity moves with a write that keeps its size and puts its mtime back
    /// (ctime moves), and differs between two files of the same bytes (inode).
    #[test]
    fn a_rewrite_with_its_mtime_put_back_changes_the_identity() {
        let dir = tempfile::tempdir().unwrap();
        let (one, two) = (dir.path().join("one"), dir.path().join("two"));
        std::fs::write(&one, b"same").unwrap();
        std::fs::write(&two, b"same").unwrap();
        let meta = |p: &Path| std::fs::metadata(p).unwrap();
        let first = meta(&one);
        assert_eq!(FileIdentity::of(&first), FileIdentity::of(&meta(&one)));
        assert_ne!(FileIdentity::of(&first), FileIdentity::of(&meta(&two)));
        // Once settled, the same rewrite cannot keep the ctime.
        FileIdentity::wait_settled(
            [&FileIdentity::of(&first)],
            std::time::Duration::from_secs(1),
        );
        assert!(FileIdentity::of(&first).settled() || first.ctime_nsec() == 0);
        std::fs::write(&one, b"diff").unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&one).unwrap();
        file.set_modified(first.modified().unwrap()).unwrap();
        let rewritten = meta(&one);
        assert_eq!(
            (rewritten.len(), rewritten.modified().unwrap()),
            (first.len(), first.modified().unwrap())
        );
        assert_ne!(FileIdentity::of(&first), FileIdentity::of(&rewritten));
    }
}
