//! What a landed batch's core tasks may not change. Before they run, the batch's files and
//! directories are made read-only (tasks run with the daemon's rights and can undo that: it
//! stops accidents, not a hostile task) and each file's identity is recorded. After they ran,
//! and before the batch is promoted, the landing directory must hold exactly what the core
//! verified: every file with its size and SHA-256, nothing removed, changed or added, no
//! symlink, no special file. Only then are the modes put back.
//!
//! A task running as root can do more than write: give a landed file or directory to another
//! owner, hard-link a file to a name outside the batch (through which it can be rewritten once
//! promoted), or set an extended attribute (an ACL granting write, a file capability). So each
//! entry's owner, mode and extended attributes are recorded once it is read-only and compared
//! after the tasks, and a landed file with more than one link is refused.
//!
//! A file whose identity (device, inode, size, mtime, ctime) did not move is not hashed again
//! if, when the tasks started, the kernel's coarse clock (which stamps ctime) was already past
//! its ctime: then any write, truncation, `chmod` or replacement by a task stamps a later ctime
//! or another inode. The tasks wait for that at most 100 ms (a tick, when the clock is sane);
//! a file it did not hold for (a ctime in the future after the clock was set back, or a file
//! system that keeps whole seconds) is hashed again.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
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
    /// Each landed file's and directory's owner, mode and extended attributes while the tasks
    /// ran, by path.
    attributes: BTreeMap<String, Attributes>,
}

/// What an entry's metadata says besides its bytes: what a task could change to give another
/// user a way in.
struct Attributes {
    uid: u32,
    gid: u32,
    mode: u32,
    /// A regular file's modification time (seconds, nanoseconds), as delivered (the edge's);
    /// a directory's moves with any entry added and removed again, and is not compared.
    mtime: Option<(i64, i64)>,
    /// Extended attributes (ACLs, capabilities, SELinux labels, user ones), name to value.
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
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
            attributes: BTreeMap::new(),
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
        for path in files.iter().chain(&directories) {
            let full = dir.join(path);
            let meta = std::fs::symlink_metadata(&full)
                .with_context(|| format!("cannot look at landed {path}"))?;
            let attributes = Attributes::of(&full, &meta)?;
            landed.attributes.insert(path.clone(), attributes);
            if let Some(expected) = landed
                .expected
                .get_mut(path)
                .filter(|e| e.kind != Kind::Dir)
            {
                expected.identity = Some(FileIdentity::of(&meta));
            }
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
    /// any symlink or special file, a file linked elsewhere, and an owner, mode or extended
    /// attribute other than the core left. Empty when it is exactly as it was.
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
                if expected.is_none_or(|e| e.kind == Kind::Dir) {
                    self.compare_attributes(&entry.path(), &path, &meta, changes)?;
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
                        if meta.nlink() > 1 {
                            let links = meta.nlink();
                            changes.push(format!(
                                "changed {path} (hard-linked: {links} links, landed with 1)"
                            ));
                        }
                        self.compare_attributes(&entry.path(), &path, &meta, changes)?;
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

    /// Adds to `changes` how the owner, mode and extended attributes of the landed entry
    /// `path` (at `full`) differ from those it had when the tasks started.
    fn compare_attributes(
        &self,
        full: &Path,
        path: &str,
        meta: &std::fs::Metadata,
        changes: &mut Changes,
    ) -> Result<()> {
        let Some(landed) = self.attributes.get(path) else {
            return Ok(());
        };
        let now = Attributes::of(full, meta)?;
        changes.extend(
            landed
                .differences(&now)
                .into_iter()
                .map(|difference| format!("changed {path} ({difference})")),
        );
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

impl Attributes {
    /// The attributes of the entry at `path`, whose metadata (not following a symlink) is
    /// `meta`.
    fn of(path: &Path, meta: &std::fs::Metadata) -> Result<Attributes> {
        Ok(Attributes {
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode() & 0o7777,
            mtime: meta.is_file().then(|| (meta.mtime(), meta.mtime_nsec())),
            xattrs: extended_attributes(path).with_context(|| {
                format!("cannot read the extended attributes of {}", path.display())
            })?,
        })
    }

    /// How `now` differs from these, one phrase per difference.
    fn differences(&self, now: &Attributes) -> Vec<String> {
        let mut differences = Vec::new();
        if (now.uid, now.gid) != (self.uid, self.gid) {
            differences.push(format!(
                "owner {}:{}, landed {}:{}",
                now.uid, now.gid, self.uid, self.gid
            ));
        }
        if now.mode != self.mode {
            differences.push(format!(
                "mode {:o}, {:o} while its tasks ran",
                now.mode, self.mode
            ));
        }
        if now.mtime != self.mtime {
            differences.push("modification time changed".to_string());
        }
        let names: BTreeSet<&Vec<u8>> = self.xattrs.keys().chain(now.xattrs.keys()).collect();
        for name in names {
            let what = match (self.xattrs.get(name), now.xattrs.get(name)) {
                (None, Some(_)) => "set",
                (Some(_), None) => "removed",
                (before, after) if before != after => "changed",
                _ => continue,
            };
            let name = String::from_utf8_lossy(name);
            differences.push(format!("extended attribute {name} {what}"));
        }
        differences
    }
}

/// The extended attributes of the entry at `path` (a symlink's own, not its target's), name to
/// value; none where the file system keeps none.
fn extended_attributes(path: &Path) -> std::io::Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let path = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `path` is NUL-terminated and lives across the call; the buffer is `len` bytes.
    let names =
        match read_sized(|buf, len| unsafe { libc::llistxattr(path.as_ptr(), buf.cast(), len) }) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(BTreeMap::new()),
            names => names?,
        };
    let mut xattrs = BTreeMap::new();
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name)?;
        // SAFETY: as above, with the NUL-terminated `cname`.
        let value = read_sized(|buf, len| unsafe {
            libc::lgetxattr(path.as_ptr(), cname.as_ptr(), buf.cast(), len)
        })?;
        xattrs.insert(name.to_vec(), value);
    }
    Ok(xattrs)
}

/// The bytes an `*xattr` call `read(buffer, length)` gives: asked for their size first, then
/// read, and asked again if they grew in between.
fn read_sized(read: impl Fn(*mut u8, usize) -> isize) -> std::io::Result<Vec<u8>> {
    loop {
        let size = read(std::ptr::null_mut(), 0);
        if size < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if size == 0 {
            return Ok(Vec::new());
        }
        let mut buffer = vec![0u8; size as usize];
        let got = read(buffer.as_mut_ptr(), buffer.len());
        if got >= 0 {
            buffer.truncate(got as usize);
            return Ok(buffer);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
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
    /// replaced by a directory, a special file added and the write bits put back.
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
        let mtime = std::fs::metadata(&one).unwrap().modified().unwrap();
        std::fs::write(&one, b"X").unwrap();
        // Its modification time put back, as `cp -p` or `touch -d` would: the bytes tell.
        let rewritten = std::fs::File::options().write(true).open(&one).unwrap();
        rewritten.set_modified(mtime).unwrap();
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
                "changed s/b (mode 755, 555 while its tasks ran)",
                "changed s/b/one (its bytes differ from the verified SHA-256)",
                "changed s/b/one (mode 644, 444 while its tasks ran)",
                "replaced s/b/two with a directory",
            ],
            "{changes:?}"
        );
    }

    /// A file linked to a name outside the batch, a directory's mode put back while the tasks
    /// run, and extended attributes set or removed are changes, each named with its path.
    #[test]
    fn links_modes_and_extended_attributes_are_changes() {
        let dir = tempfile::tempdir().unwrap();
        let files = [
            placed(dir.path(), "s/b/one", b"1"),
            placed(dir.path(), "s/b/two", b"22"),
        ];
        let set = |path: &str, value: Option<&[u8]>| {
            let path =
                std::ffi::CString::new(dir.path().join(path).into_os_string().into_encoded_bytes())
                    .unwrap();
            // SAFETY: NUL-terminated strings and a buffer of the length given.
            let done = unsafe {
                match value {
                    Some(v) => libc::lsetxattr(
                        path.as_ptr(),
                        c"user.note".as_ptr(),
                        v.as_ptr().cast(),
                        v.len(),
                        0,
                    ),
                    None => libc::lremovexattr(path.as_ptr(), c"user.note".as_ptr()),
                }
            };
            assert_eq!(done, 0, "{}", std::io::Error::last_os_error());
        };
        set("s/b/two", Some(b"as landed"));
        let landed = Landed::protect(dir.path(), &files).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::hard_link(dir.path().join("s/b/one"), elsewhere.path().join("link")).unwrap();
        std::fs::set_permissions(
            dir.path().join("s/b"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        set("s/b/one", Some(b"new"));
        set("s/b/two", None);
        let changes = landed.changes(dir.path()).unwrap();
        assert_eq!(
            changes,
            [
                "changed s/b (mode 777, 555 while its tasks ran)",
                "changed s/b/one (extended attribute user.note set)",
                "changed s/b/one (hard-linked: 2 links, landed with 1)",
                "changed s/b/two (extended attribute user.note removed)",
            ],
            "{changes:?}"
        );
    }

    #[test]
    fn a_file_given_another_modification_time_is_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let files = [placed(dir.path(), "s/b/one", b"1")];
        let landed = Landed::protect(dir.path(), &files).unwrap();
        let file = std::fs::File::open(dir.path().join("s/b/one")).unwrap();
        file.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(978_307_200))
            .unwrap();
        let changes = landed.changes(dir.path()).unwrap();
        assert_eq!(
            changes,
            ["changed s/b/one (modification time changed)"],
            "{changes:?}"
        );
    }
}
