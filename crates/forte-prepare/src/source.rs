//! Finding the files to prepare: a single file, or a directory tree walked without following
//! symbolic links.

use std::fs::Metadata;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use forte_format::manifest::validate_path;
use forte_format::Kind;

/// One regular file or empty directory to prepare.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Where it is on this machine.
    pub local: PathBuf,
    /// Its `/`-separated path relative to the source root, as it goes into the manifest.
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    pub mode: u32,
    pub mtime_s: i64,
    pub mtime_ns: u32,
}

impl SourceFile {
    fn new(local: PathBuf, path: String, kind: Kind, meta: &Metadata) -> Self {
        Self {
            local,
            path,
            kind,
            size: if kind == Kind::File { meta.len() } else { 0 },
            mode: meta.permissions().mode() & 0o777,
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec() as u32,
        }
    }
}

/// What a walk found: the files to prepare, and what it refused with the reason.
#[derive(Debug, Default)]
pub struct Discovery {
    pub files: Vec<SourceFile>,
    /// Refused entries, for reports: each path is valid UTF-8, a name that is not being
    /// given lossily (U+FFFD for the bytes that are not), so text and JSON reports can print
    /// every one of them.
    pub rejected: Vec<(PathBuf, String)>,
}

/// `path` as valid UTF-8 for a report (serde refuses to serialise a path that is not).
fn printable(path: &Path) -> PathBuf {
    PathBuf::from(path.to_string_lossy().into_owned())
}

impl Discovery {
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// Lists `root` (a regular file, or a directory walked recursively) in path order. Regular files
/// and empty directories are kept; symbolic links, devices, sockets, FIFOs and names that are not
/// UTF-8 are refused and listed in [`Discovery::rejected`], never followed.
pub fn discover(root: &Path) -> Result<Discovery> {
    let meta = std::fs::symlink_metadata(root)
        .with_context(|| format!("cannot read source {}", root.display()))?;
    let mut found = Discovery::default();
    if meta.is_file() {
        let name = root
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("source {} has no UTF-8 file name", root.display()))?;
        found.files.push(SourceFile::new(
            root.to_path_buf(),
            name.to_string(),
            Kind::File,
            &meta,
        ));
    } else if meta.is_dir() {
        walk(root, "", &mut found)?;
    } else {
        bail!(
            "source {} is neither a regular file nor a directory",
            root.display()
        );
    }
    found.files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

fn walk(dir: &Path, prefix: &str, found: &mut Discovery) -> Result<()> {
    let mut entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list directory {}", dir.display()))?
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("cannot list directory {}", dir.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let local = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            found
                .rejected
                .push((printable(&local), "name is not UTF-8".into()));
            continue;
        };
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if let Err(why) = validate_path(&path) {
            found.rejected.push((printable(&local), why));
            continue;
        }
        // Not following a symbolic link, like `symlink_metadata`, but looked up by name in the
        // open directory rather than along the whole path again.
        let meta = entry
            .metadata()
            .with_context(|| format!("cannot read {}", local.display()))?;
        let kind = meta.file_type();
        if kind.is_file() {
            found
                .files
                .push(SourceFile::new(local, path, Kind::File, &meta));
        } else if kind.is_dir() {
            let before = found.files.len() + found.rejected.len();
            walk(&local, &path, found)?;
            if found.files.len() + found.rejected.len() == before {
                found
                    .files
                    .push(SourceFile::new(local, path, Kind::Dir, &meta));
            }
        } else {
            let what = if kind.is_symlink() {
                "a symbolic link"
            } else {
                "not a regular file"
            };
            found.rejected.push((
                printable(&local),
                format!("{what}; only regular files and directories are packed"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_keeps_files_and_empty_dirs_and_refuses_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(root.join("empty")).unwrap();
        std::fs::write(root.join("a/b/f.txt"), b"hi").unwrap();
        std::fs::write(root.join("top"), b"").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        let found = discover(root).unwrap();
        let paths: Vec<_> = found
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.kind))
            .collect();
        assert_eq!(
            paths,
            [
                ("a/b/f.txt", Kind::File),
                ("empty", Kind::Dir),
                ("top", Kind::File)
            ]
        );
        assert_eq!(found.rejected.len(), 1);
        assert!(found.rejected[0].1.contains("symbolic link"));
        assert_eq!(found.total_bytes(), 2);
    }

    #[test]
    fn names_that_are_not_utf8_are_rejected_and_reported_printably() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("good.txt"), b"hi").unwrap();
        std::fs::write(root.join(OsStr::from_bytes(b"bad\xff.txt")), b"x").unwrap();
        std::fs::create_dir(root.join(OsStr::from_bytes(b"dir\xfe"))).unwrap();
        std::fs::write(root.join(OsStr::from_bytes(b"dir\xfe/inside")), b"y").unwrap();
        let found = discover(root).unwrap();
        let paths: Vec<_> = found.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["good.txt"]);
        let rejected: Vec<_> = found
            .rejected
            .iter()
            .map(|(p, why)| {
                let p = p.to_str().expect("a rejected path is printable as UTF-8");
                (
                    p.strip_prefix(root.to_str().unwrap()).unwrap(),
                    why.as_str(),
                )
            })
            .collect();
        assert_eq!(
            rejected,
            [
                ("/bad\u{FFFD}.txt", "name is not UTF-8"),
                ("/dir\u{FFFD}", "name is not UTF-8")
            ]
        );
    }
}
