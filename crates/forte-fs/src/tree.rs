//! Removing a tree forte made read-only (a landed batch, protected while its tasks ran) and
//! that an interrupted process could not give its write bits back: without them a daemon that
//! is not root cannot remove the tree's contents, and would fail on it at every start.

use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Removes the tree at `path` (nothing there is fine), giving its directories their owner's
/// read, write and search bits back first if it has to (a task may have left one at 000). Symbolic links are removed, never followed.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            // Not ours to make writable: the first error says more.
            make_writable(path).map_err(|_| e)?;
            std::fs::remove_dir_all(path)
        }
        Err(e) => Err(e),
    }
}

/// Gives every directory under `dir` (and `dir`) its owner's read, write and search bits.
fn make_writable(dir: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Ok(());
    }
    let mode = meta.permissions().mode();
    if mode & 0o700 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o700))?;
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            make_writable(&entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// Set for the copy of this test binary that runs as another user: the tree to remove.
    const AS_OTHER_USER: &str = "FORTE_FS_TEST_REMOVE_AS_OTHER_USER";

    /// The part of the test that runs as `nobody` (root ignores permissions, so the test
    /// binary runs itself again under another uid for it); does nothing in a normal run.
    #[test]
    fn remove_a_read_only_tree_as_another_user() {
        if let Ok(tree) = std::env::var(AS_OTHER_USER) {
            a_read_only_tree_is_removed_in(Path::new(&tree));
        }
    }

    /// Makes a read-only tree in `tree` and removes it.
    fn a_read_only_tree_is_removed_in(tree: &Path) {
        let batch = tree.join("batch");
        std::fs::create_dir_all(batch.join("sub")).unwrap();
        std::fs::write(batch.join("sub/f.dat"), b"data").unwrap();
        std::os::unix::fs::symlink("/etc", batch.join("link")).unwrap();
        std::fs::create_dir(batch.join("closed")).unwrap();
        for (dir, mode) in [
            (batch.join("sub"), 0o555),
            (batch.join("closed"), 0o000),
            (batch.clone(), 0o555),
        ] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        assert!(
            std::fs::remove_dir_all(&batch).is_err(),
            "read-only as it should be"
        );
        remove_tree(&batch).unwrap();
        assert!(!batch.exists());
    }

    #[test]
    fn a_read_only_tree_is_removed_by_a_user_who_is_not_root() {
        let tmp = tempfile::tempdir().unwrap();
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            // Not root: this process is such a user already.
            return a_read_only_tree_is_removed_in(tmp.path());
        }
        let tree = tmp.path().join("for-nobody");
        std::fs::create_dir(&tree).unwrap();
        let nobody = 65534;
        std::os::unix::fs::chown(&tree, Some(nobody), Some(nobody)).unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child
            .args([
                "--exact",
                "tree::tests::remove_a_read_only_tree_as_another_user",
                "--nocapture",
            ])
            .env(AS_OTHER_USER, &tree);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            child.pre_exec(move || {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(nobody) != 0
                    || libc::setuid(nobody) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = child.output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{said}");
        assert!(
            said.contains("1 passed"),
            "the part as nobody did not run: {said}"
        );
        assert!(!tree.join("batch").exists());
    }
}
