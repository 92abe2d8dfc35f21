//! The store in a directory: each key a file under the root. Every write goes to the site's
//! `tmp/` and is renamed into place; then the file system is flushed with a group commit (one
//! `syncfs` shared by all uploads waiting at that moment) before the relay answers.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use super::backend::{Backend, Entry, Reader};
use super::{Result, StoreError};

/// A body written to a temporary file, and where it is to go.
struct Written {
    tmp: PathBuf,
    target: PathBuf,
}

pub struct DirBackend {
    root: PathBuf,
    group_sync: forte_fs::GroupSync,
}

impl DirBackend {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            group_sync: forte_fs::GroupSync::new(root),
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// Where a body bound for `key` is written first: `sites/<site>/tmp/`, on the same file
    /// system as its target and removed whole when the relay starts.
    fn tmp_dir(&self, key: &str) -> PathBuf {
        let mut segments = key.split('/');
        match (segments.next(), segments.next()) {
            (Some("sites"), Some(site)) => self.root.join("sites").join(site).join("tmp"),
            _ => self.root.join("tmp"),
        }
    }

    /// Writes `bytes` to a fresh temporary file next to where `key` goes.
    fn write_tmp(&self, key: &str, bytes: &[u8], what: &str) -> Result<Written> {
        let (tmp_dir, target) = (self.tmp_dir(key), self.path(key));
        let dir = target
            .parent()
            .expect("keys live in a directory")
            .to_path_buf();
        for d in [&tmp_dir, &dir] {
            std::fs::create_dir_all(d).map_err(|e| StoreError::io(what, d, e))?;
        }
        let mut suffix = [0u8; 8];
        getrandom::getrandom(&mut suffix).map_err(|e| StoreError::Io(e.to_string()))?;
        let tmp = tmp_dir.join(hex::encode(suffix));
        if let Err(e) = forte_fs::create_with(&tmp, bytes) {
            let _ = std::fs::remove_file(&tmp);
            return Err(StoreError::io(what, &tmp, e));
        }
        Ok(Written { tmp, target })
    }

    /// Removes the temporary directories a stopped relay left.
    pub fn remove_tmp(&self) {
        for site in self.children("sites", "").unwrap_or_default() {
            let _ = std::fs::remove_dir_all(self.root.join("sites").join(site).join("tmp"));
        }
    }
}

fn walk(dir: &Path, key: &str, out: &mut Vec<Entry>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let key = format!("{key}/{name}");
        let Ok(meta) = e.metadata() else { continue };
        if meta.is_dir() {
            walk(&e.path(), &key, out);
        } else {
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            out.push(Entry {
                key,
                size: meta.len(),
                modified,
                version: None,
            });
        }
    }
}

impl Backend for DirBackend {
    fn put(&self, key: &str, bytes: &[u8], what: &str) -> Result<()> {
        let Written { tmp, target } = self.write_tmp(key, bytes, what)?;
        std::fs::rename(&tmp, &target).map_err(|e| StoreError::io(what, &target, e))?;
        // One flush of the file system covers the data and both directory entries, shared
        // with every other upload waiting at the same moment.
        self.flush(what)
    }

    fn spool_dir(&self, key: &str) -> PathBuf {
        self.tmp_dir(key)
    }

    fn put_file(&self, key: &str, spooled: &Path, what: &str) -> Result<()> {
        let target = self.path(key);
        let dir = target.parent().expect("keys live in a directory");
        let placed = std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::io(what, dir, e))
            .and_then(|()| {
                std::fs::rename(spooled, &target).map_err(|e| StoreError::io(what, &target, e))
            });
        if placed.is_err() {
            let _ = std::fs::remove_file(spooled);
        }
        placed?;
        self.flush(what)
    }

    fn put_new(&self, key: &str, bytes: &[u8], what: &str) -> Result<bool> {
        let Written { tmp, target } = self.write_tmp(key, bytes, what)?;
        // A link, unlike a rename, fails when the name is taken.
        let linked = std::fs::hard_link(&tmp, &target);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => self.flush(what).map(|()| true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(StoreError::io(what, &target, e)),
        }
    }

    fn get(&self, key: &str, what: &str) -> Result<Option<Vec<u8>>> {
        let path = self.path(key);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io(what, &path, e)),
        }
    }

    fn open(&self, key: &str, what: &str) -> Result<Option<Reader>> {
        let path = self.path(key);
        let opened = std::fs::File::open(&path).and_then(|f| {
            let meta = f.metadata()?;
            // A directory opens, and fails only when read: after the answer began.
            if meta.is_dir() {
                return Err(std::io::Error::from(ErrorKind::IsADirectory));
            }
            Ok((meta.len(), f))
        });
        match opened {
            Ok((length, file)) => Ok(Some((Box::new(file), length))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io(what, &path, e)),
        }
    }

    fn exists(&self, key: &str, _what: &str) -> Result<bool> {
        Ok(self.path(key).exists())
    }

    fn any_under(&self, prefix: &str, _what: &str) -> Result<bool> {
        Ok(self.path(prefix).exists())
    }

    fn delete(&self, key: &str, what: &str) -> Result<()> {
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io(what, &path, e)),
        }
    }

    fn delete_under(&self, prefixes: &[String], what: &str) -> Result<Vec<Entry>> {
        let mut removed = Vec::new();
        for prefix in prefixes {
            let listed = self.list(prefix, what)?;
            let dir = self.path(prefix);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io(what, &dir, e)),
            }
            removed.extend(listed);
        }
        Ok(removed)
    }

    fn list(&self, prefix: &str, _what: &str) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        walk(&self.path(prefix), prefix, &mut out);
        Ok(out)
    }

    fn children(&self, prefix: &str, _what: &str) -> Result<Vec<String>> {
        Ok(std::fs::read_dir(self.path(prefix))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect())
    }

    fn flush(&self, what: &str) -> Result<()> {
        self.group_sync
            .sync()
            .map_err(|e| StoreError::Io(format!("{what}: cannot flush to disk: {e:#}")))
    }

    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn shared(&self) -> bool {
        false
    }
}
