//! What a landed batch's core tasks may not change. Before they run, the batch's files and
//! directories are made read-only (tasks run with the daemon's rights and can undo that: it
//! stops accidents, not a hostile task) and each file's identity is recorded. After they ran,
//! and before the batch is promoted, the landing directory must hold exactly what the core
//! verified: every file with its size and SHA-256, nothing removed, changed or added, no
//! symlink, no special file. Only then are the modes put back.
//!
//! A file whose identity (device, inode, size, mtime, ctime) did not move is not hashed again
//! if, when the tasks started, the kernel's coarse clock (which stamps ctime) was already past
//! its ctime: then any write, truncation, `chmod` or replacement by a task stamps a later ctime
//! or another inode. The tasks wait for that at most 100 ms (a tick, when the clock is sane);
//! a file it did not hold for (a ctime in the future after the clock was set back, or a file
//! system that keeps whole seconds) is hashed again.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, Result};
use forte_format::Kind;
use forte_fs::FileIdentity;
use forte_restore::Placed;

/// A landed batch as the core verified it, before its tasks ran.
pub struct Landed {
    /// What each entry of the landing directory is, by its path under it.
    expected: BTreeMap<String, Expected>,
    /// Directories that hold expected entries, by path (they may be there, and must keep
    /// their files).
    parents: BTreeSet<String>,
    /// The modes to put back after the tasks, deepest first.
    modes: Vec<(String, u32)>,
}

struct Expected {
    kind: Kind,
    size: u64,
    sha256: String,
    /// The file's identity once made read-only; `None` for a directory.
    identity: Option<FileIdentity>,
    /// Whether any change from before the tasks started is sure to move that identity
    /// ([`FileIdentity::settled`] then): only such a file may go unhashed after them.
    settled: bool,
}

/// What a task did to the landed batch, one line per entry.
pub type Changes = Vec<String>;

impl Landed {
    /// Makes the files written into `dir` (`placed`, those not found in place at the
    /// destination) read-only, records each one's identity, and waits until a change to any
    /// of them would show in its ctime.
    pub fn protect(dir: &Path, placed: &[Placed]) -> Result<Landed> {
        let mut landed = Landed {
            expected: BTreeMap::new(),
            parents: BTreeSet::new(),
            modes: Vec::new(),
        };
        for p in placed.iter().filter(|p| !p.already) {
            let mut parent = Path::new(&p.target).parent();
            while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
                landed.parents.insert(dir.to_string_lossy().into_owned());
                parent = dir.parent();
            }
            landed.expected.insert(
                p.target.clone(),
                Expected {
                    kind: p.kind,
                    size: p.size,
                    sha256: p.sha256.clone(),
                    identity: None,
                    settled: false,
                },
            );
        }
        let directories: Vec<String> = landed
            .parents
            .iter()
            .cloned()
            .chain(
                landed
                    .expected
                    .iter()
                    .filter(|(_, e)| e.kind == Kind::Dir)
                    .map(|(t, _)| t.clone()),
            )
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let files: Vec<String> = landed
            .expected
            .iter()
            .filter(|(_, e)| e.kind != Kind::Dir)
            .map(|(t, _)| t.clone())
            .collect();
        // Files first, then directories, deepest first: a directory made read-only before its
        // files are changed would still let them be, but not the other way round.
        for path in files.iter().chain(directories.iter().rev()) {
            let full = dir.join(path);
            let meta = std::fs::symlink_metadata(&full)
                .with_context(|| format!("cannot look at landed {}", full.display()))?;
            let mode = meta.permissions().mode() & 0o7777;
            std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode & !0o222))
                .with_context(|| format!("cannot make landed {} read-only", full.display()))?;
            landed.modes.push((path.clone(), mode));
        }
        for path in &files {
            let meta = std::fs::symlink_metadata(dir.join(path))
                .with_context(|| format!("cannot look at landed {path}"))?;
            let expected = landed.expected.get_mut(path).expect("listed");
            expected.identity = Some(FileIdentity::of(&meta));
        }
        FileIdentity::wait_settled(
            landed.expected.values().filter_map(|e| e.identity.as_ref()),
            std::time::Duration::from_millis(100),
        );
        // Judged now, before the tasks start: later, the clock is past any ctime.
        for expected in landed.expected.values_mut() {
            expected.settled = expected.identity.is_some_and(|i| i.settled());
        }
        Ok(landed)
    }

    /// What differs in `dir` from the batch as verified: entries removed, changed or added,
    /// and any symlink or special file. Empty when it is exactly as it was.
    pub fn changes(&self, dir: &Path) -> Result<Changes> {
        let mut changes = Vec::new();
        let mut seen = BTreeSet::new();
        self.walk(dir, "", &mut seen, &mut changes)?;
        changes.extend(
            self.expected
                .keys()
                .filter(|path| !seen.contains(*path))
                .map(|path| format!("removed {path}")),
        );
        // The same order whatever order the directory gave.
        changes.sort();
        Ok(changes)
    }

    fn walk(
        &self,
        root: &Path,
        under: &str,
        seen: &mut BTreeSet<String>,
        changes: &mut Changes,
    ) -> Result<()> {
        let dir = root.join(under);
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if under.is_empty() {
                name
            } else {
                format!("{under}/{name}")
            };
            let meta = std::fs::symlink_metadata(entry.path())
                .with_context(|| format!("cannot look at {}", entry.path().display()))?;
            let expected = self.expected.get(&path);
            let kind = meta.file_type();
            if kind.is_dir() {
                match expected {
                    Some(e) if e.kind != Kind::Dir => {
                        changes.push(format!("replaced {path} with a directory"))
                    }
                    None if !self.parents.contains(&path) => {
                        changes.push(format!("added directory {path}"))
                    }
                    _ => {}
                }
                if expected.is_some() {
                    seen.insert(path.clone());
                }
                self.walk(root, &path, seen, changes)?;
                continue;
            }
            if expected.is_some() {
                seen.insert(path.clone());
            }
            let what = if kind.is_symlink() {
                "a symlink"
            } else if !kind.is_file() {
                "a special file"
            } else {
                match expected {
                    None => {
                        changes.push(format!("added {path}"));
                        continue;
                    }
                    Some(e) if e.kind == Kind::Dir => "a file",
                    Some(e) => {
                        if let Some(change) = changed(&entry.path(), &meta, e)? {
                            changes.push(format!("changed {path} ({change})"));
                        }
                        continue;
                    }
                }
            };
            changes.push(match expected {
                Some(_) => format!("replaced {path} with {what}"),
                None => format!("added {what} {path}"),
            });
        }
        Ok(())
    }

    /// Puts back the modes [`Landed::protect`] took the write bits from.
    pub fn release(&self, dir: &Path) -> Result<()> {
        for (path, mode) in self.modes.iter().rev() {
            let full = dir.join(path);
            match std::fs::set_permissions(&full, std::fs::Permissions::from_mode(*mode)) {
                Ok(()) => {}
                // Removed by a task: reported by `changes`.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("cannot restore the mode of {}", full.display()))
                }
            }
        }
        Ok(())
    }
}

/// How the file at `path` differs from what was verified, if it does: its size, or its bytes
/// (hashed only when its identity moved or cannot prove it unchanged).
fn changed(path: &Path, meta: &std::fs::Metadata, expected: &Expected) -> Result<Option<String>> {
    if meta.len() != expected.size {
        return Ok(Some(format!(
            "{} bytes, verified {}",
            meta.len(),
            expected.size
        )));
    }
    let now = FileIdentity::of(meta);
    if expected
        .identity
        .is_some_and(|before| before == now && expected.settled)
    {
        return Ok(None);
    }
    let sha256 = forte_format::seal::sha256_file(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok((sha256 != expected.sha256)
        .then(|| "its bytes differ from the verified SHA-256".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use forte_format::ObjectId;

    /// A landed file `target` with `bytes`, as the core verified it.
    fn placed(dir: &Path, target: &str, bytes: &[u8]) -> Placed {
        let path = dir.join(target);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        Placed {
            id: ObjectId::random(),
            carrier: ObjectId::random(),
            path: target.into(),
            target: target.into(),
            size: bytes.len() as u64,
            sha256: forte_format::seal::sha256_hex(bytes),
            kind: Kind::File,
            already: false,
            parts: Vec::new(),
        }
    }

    #[test]
    fn an_untouched_batch_has_no_changes_and_gets_its_modes_back() {
        let dir = tempfile::tempdir().unwrap();
        let files = [
            placed(dir.path(), "s/b/one", b"1"),
            placed(dir.path(), "s/b/two", b"22"),
        ];
        let landed = Landed::protect(dir.path(), &files).unwrap();
        let mode = |p: &str| {
            std::fs::metadata(dir.path().join(p))
                .unwrap()
                .permissions()
                .mode()
        };
        assert_eq!(mode("s/b/one") & 0o222, 0, "read-only while tasks run");
        assert_eq!(mode("s/b") & 0o222, 0);
        assert!(landed.changes(dir.path()).unwrap().is_empty());
        landed.release(dir.path()).unwrap();
        assert_ne!(mode("s/b/one") & 0o200, 0);
        assert_ne!(mode("s/b") & 0o200, 0);
    }

    /// A rewrite at once after the batch was protected, same size, is caught; so are a file
    /// replaced by a directory and a special file added.
    #[test]
    fn rewrites_replacements_and_special_files_are_changes() {
        let dir = tempfile::tempdir().unwrap();
        let files = [
            placed(dir.path(), "s/b/one", b"1"),
            placed(dir.path(), "s/b/two", b"22"),
        ];
        let landed = Landed::protect(dir.path(), &files).unwrap();
        let one = dir.path().join("s/b/one");
        std::fs::set_permissions(&one, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&one, b"X").unwrap();
        let two = dir.path().join("s/b/two");
        std::fs::set_permissions(
            dir.path().join("s/b"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::remove_file(&two).unwrap();
        std::fs::create_dir(&two).unwrap();
        let fifo = std::ffi::CString::new(
            dir.path()
                .join("s/b/pipe")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let changes = landed.changes(dir.path()).unwrap();
        assert_eq!(
            changes,
            [
                "added a special file s/b/pipe",
                "changed s/b/one (its bytes differ from the verified SHA-256)",
                "replaced s/b/two with a directory",
            ],
            "{changes:?}"
        );
    }
}
