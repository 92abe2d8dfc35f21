//! Creating forte's own directories under a destination (`.forte-custody`, `.forte-replaced`)
//! without following a symbolic link someone put on the way: `create_dir_all` would follow
//! one, and the core would then write its replay records, or keep replaced versions, wherever
//! the link points.

use std::io::{Error, ErrorKind};
use std::path::{Component, Path, PathBuf};

/// Creates `root/rel` and the directories between (`root` must exist), each a real
/// directory: an entry on the way that is a symbolic link, a file or anything else is an
/// error naming it, and nothing under it is created. `rel` is relative, without `..`.
pub fn create_dirs_under(root: &Path, rel: &Path) -> std::io::Result<PathBuf> {
    let mut dir = root.to_path_buf();
    for component in rel.components() {
        let Component::Normal(name) = component else {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("{} is not a plain relative path", rel.display()),
            ));
        };
        dir.push(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => continue,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::new(e.kind(), format!("{}: {e}", dir.display()))),
        }
        let meta = std::fs::symlink_metadata(&dir)?;
        if !meta.is_dir() {
            let what = if meta.file_type().is_symlink() {
                "a symbolic link"
            } else {
                "not a directory"
            };
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "{} is {what}, where forte keeps a directory of its own: move it away",
                    dir.display()
                ),
            ));
        }
    }
    Ok(dir)
}

/// Holds an exclusive `flock` on the directory `dir` until dropped, waiting for another
/// holder to let go: for a read-modify-write of a record in it by processes that share no
/// catalogue (two core workers on one destination).
pub struct DirLock {
    _dir: std::fs::File,
}

impl DirLock {
    pub fn take(dir: &Path) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(dir)
            .map_err(|e| Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        // SAFETY: flock on a file descriptor this function owns; no memory is shared.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            let e = Error::last_os_error();
            return Err(Error::new(
                e.kind(),
                format!("cannot lock {}: {e}", dir.display()),
            ));
        }
        Ok(Self { _dir: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_are_created_and_a_link_on_the_way_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let made = create_dirs_under(root.path(), Path::new(".forte-custody/site-a")).unwrap();
        assert!(made.is_dir());
        assert_eq!(made, root.path().join(".forte-custody/site-a"));
        // Again: there already.
        create_dirs_under(root.path(), Path::new(".forte-custody/site-a")).unwrap();

        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join(".forte-replaced")).unwrap();
        let err =
            create_dirs_under(root.path(), Path::new(".forte-replaced/site-a/run")).unwrap_err();
        assert!(
            err.to_string()
                .contains(".forte-replaced is a symbolic link"),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);

        std::fs::write(root.path().join("file"), b"").unwrap();
        let err = create_dirs_under(root.path(), Path::new("file/under")).unwrap_err();
        assert!(err.to_string().contains("is not a directory"), "{err}");
        assert!(create_dirs_under(root.path(), Path::new("../out")).is_err());
    }
}
