//! Where a landed batch will be promoted, watched while its core tasks run. Promotion enters
//! directories the destination has and takes a file found there with the verified bytes as
//! already in place: a task that put something where the batch goes (a file beside it, a
//! symbolic link, a hard link to bytes it can change later) would have it delivered with the
//! batch. So the destination's entries at the batch's paths are looked at before the tasks and
//! again after; any difference gets the batch quarantined.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use forte_fs::FileIdentity;
use forte_restore::Placed;

/// What one path of the destination was: nothing, or an entry of a kind with an identity.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Absent,
    /// A directory: other batches may be promoted into it meanwhile, so only that it is the
    /// same directory counts.
    Directory {
        dev: u64,
        ino: u64,
    },
    /// Anything else: its identity (which moves when it is written or replaced), and its
    /// mode and link count.
    Other {
        identity: FileIdentity,
        mode: u32,
        nlink: u64,
    },
}

impl Entry {
    fn at(path: &Path) -> Entry {
        match std::fs::symlink_metadata(path) {
            Err(_) => Entry::Absent,
            Ok(m) if m.is_dir() => Entry::Directory {
                dev: m.dev(),
                ino: m.ino(),
            },
            Ok(m) => Entry::Other {
                identity: FileIdentity::of(&m),
                mode: m.mode(),
                nlink: m.nlink(),
            },
        }
    }
}

/// The destination's entries at a batch's paths (its files' targets and the directories
/// above them), as they were.
pub struct WhereItGoes(BTreeMap<String, Entry>);

impl WhereItGoes {
    /// Looks at `dest` where the files of `placed` delivered now go.
    pub fn of(dest: &Path, placed: &[Placed]) -> Self {
        let mut paths = BTreeSet::new();
        for p in placed.iter().filter(|p| !p.already) {
            let mut path = Path::new(&p.target);
            paths.insert(p.target.clone());
            while let Some(parent) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                paths.insert(parent.to_string_lossy().into_owned());
                path = parent;
            }
        }
        Self(
            paths
                .into_iter()
                .map(|p| {
                    let entry = Entry::at(&dest.join(&p));
                    (p, entry)
                })
                .collect(),
        )
    }

    /// What is different at `dest` now, one phrase per path.
    pub fn changes(&self, dest: &Path) -> Vec<String> {
        self.0
            .iter()
            .filter_map(|(path, was)| {
                let now = Entry::at(&dest.join(path));
                (now != *was).then(|| match (was, &now) {
                    (Entry::Absent, _) => format!("put {path} at the destination"),
                    (_, Entry::Absent) => format!("removed {path} at the destination"),
                    _ => format!("changed {path} at the destination"),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(target: &str) -> Placed {
        Placed {
            id: forte_format::ObjectId::random(),
            carrier: forte_format::ObjectId::random(),
            path: target.rsplit('/').next().unwrap().to_string(),
            target: target.to_string(),
            size: 1,
            sha256: String::new(),
            kind: forte_format::Kind::File,
            already: false,
            parts: Vec::new(),
        }
    }

    #[test]
    fn what_a_task_puts_where_the_batch_goes_is_a_change_and_other_batches_are_not() {
        let dest = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dest.path().join("site")).unwrap();
        let batch = [placed("site/b/one"), placed("site/b/sub/two")];
        let before = WhereItGoes::of(dest.path(), &batch);
        // Another batch promoted into the site's directory meanwhile: not this batch's paths.
        std::fs::create_dir_all(dest.path().join("site/other")).unwrap();
        assert!(before.changes(dest.path()).is_empty());
        std::fs::create_dir_all(dest.path().join("site/b/sub")).unwrap();
        std::fs::write(dest.path().join("site/b/sub/two"), b"2").unwrap();
        assert_eq!(
            before.changes(dest.path()),
            [
                "put site/b at the destination",
                "put site/b/sub at the destination",
                "put site/b/sub/two at the destination",
            ]
        );
    }
}
