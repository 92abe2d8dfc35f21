//! The restore engine on its own: archives packed by `forte-prepare` in a temporary directory,
//! restored under settings chosen to reach one behaviour at a time (part order under a tight
//! budget, one bad part failing everything, what is in the way at the destination).

use std::path::{Path, PathBuf};

use forte_format::keys::{generate, KeyPaths};
use forte_format::{EdgeKey, Identities, Inventory, Recipients, TrustedEdges};
use forte_prepare::{discover, DirSink, Prepare, PrepareConfig, PrepareJob};
use forte_restore::{DirSource, Existing, Restore, RestoreConfig, RestoreFailure};

/// A source tree packed into an archive, and the keys to open it.
struct Packed {
    _dir: tempfile::TempDir,
    keys: KeyPaths,
    archive: PathBuf,
    dest: PathBuf,
}

/// Bytes that do not compress, so each part is as long as its raw slice.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Packs `files` (relative path, contents) with parts of `part_size` bytes.
fn pack(files: &[(&str, Vec<u8>)], part_size: u64) -> Packed {
    let dir = tempfile::tempdir().unwrap();
    let keys = generate(&dir.path().join("keys")).unwrap();
    let src = dir.path().join("src");
    for (path, bytes) in files {
        let path = src.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    let recipients = Recipients::load(&keys.core_pub).unwrap();
    let key = EdgeKey::load(&keys.edge_key).unwrap();
    let config = PrepareConfig {
        part_size,
        ..PrepareConfig::for_this_machine()
    };
    let archive = dir.path().join("archive");
    let sink = DirSink::create(&archive).unwrap();
    let prepare = Prepare::new(config, &recipients, &key);
    let jobs = discover(&src)
        .unwrap()
        .files
        .into_iter()
        .map(PrepareJob::fresh)
        .collect();
    let outcomes = prepare.run(jobs, &sink);
    assert!(outcomes.iter().all(|o| o.error.is_none()), "{outcomes:?}");
    let entries = outcomes
        .iter()
        .filter_map(|o| o.inventory_entry())
        .collect();
    sink.put_inventory(
        &Inventory::new("", forte_format::Instance::new("", 0, 0), entries).seal(&key, &recipients),
    )
    .unwrap();
    sink.finish().unwrap();
    let dest = dir.path().join("dest");
    Packed {
        _dir: dir,
        keys,
        archive,
        dest,
    }
}

impl Packed {
    fn restore(&self, config: RestoreConfig) -> anyhow::Result<forte_restore::Delivered> {
        let identities = Identities::load(&self.keys.core_key).unwrap();
        let trusted =
            TrustedEdges::load(&[forte_format::TrustSpec::any_site(&self.keys.edge_pub)]).unwrap();
        let restore = Restore::new(config, &identities, &trusted);
        let source = DirSource {
            root: self.archive.clone(),
        };
        restore.run(&source, &self.dest, &|m| Ok(m.path.clone()))
    }

    /// The directory of the object restored to `path`.
    fn object_of(&self, path: &str) -> PathBuf {
        let identities = Identities::load(&self.keys.core_key).unwrap();
        let trusted =
            TrustedEdges::load(&[forte_format::TrustSpec::any_site(&self.keys.edge_pub)]).unwrap();
        let source = DirSource {
            root: self.archive.clone(),
        };
        let objects = forte_restore::open_objects(&source, &identities, &trusted).unwrap();
        let object = objects
            .iter()
            .find(|o| o.manifest.path == path)
            .expect("an object for the path");
        self.archive.join(object.manifest.id.to_string())
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn parts_are_assembled_in_order_with_one_part_in_flight() {
    // 75 parts of 4 KiB per file, two files, verified on two CPUs with room for one part:
    // the parts must still come out in order and the budget must not deadlock.
    let files = [
        ("a/one.bin", noise(300 << 10, 1)),
        ("two.bin", noise((300 << 10) + 17, 2)),
    ];
    let packed = pack(&files, 4096);
    let delivered = packed
        .restore(RestoreConfig {
            cpu: 2,
            parts_in_flight: 1,
            writers: 1,
            ..RestoreConfig::for_this_machine()
        })
        .unwrap();
    assert_eq!(delivered.files, 2);
    assert_eq!(delivered.bytes, (600 << 10) + 17);
    for (path, bytes) in &files {
        assert!(
            std::fs::read(packed.dest.join(path)).unwrap() == *bytes,
            "{path} differs"
        );
    }
}

#[test]
fn one_damaged_part_fails_the_whole_restore_and_names_it() {
    let files = [
        ("good.bin", noise(64 << 10, 3)),
        ("bad.bin", noise(64 << 10, 4)),
    ];
    let packed = pack(&files, 16 << 10);
    let part = packed.object_of("bad.bin").join("part-000002.zst.age");
    let mut bytes = std::fs::read(&part).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&part, bytes).unwrap();

    let e = packed
        .restore(RestoreConfig::for_this_machine())
        .unwrap_err();
    let failure = e
        .downcast_ref::<RestoreFailure>()
        .expect("a RestoreFailure");
    assert_eq!(failure.problems.len(), 1, "{failure}");
    let problem = &failure.problems[0];
    assert_eq!(problem.part, Some(2), "{failure}");
    assert!(problem.damaged, "{failure}");
    assert!(
        problem.message.contains("bad.bin") && problem.message.contains("SHA-256"),
        "{failure}"
    );
    // All or nothing: the intact file is not delivered either, and no staging is left.
    assert_eq!(entries(&packed.dest), Vec::<String>::new());
}

#[test]
fn a_file_in_the_way_is_refused_kept_when_identical_and_replaced_when_told() {
    let files = [("f.bin", noise(10_000, 5)), ("g.bin", noise(10_000, 6))];
    let packed = pack(&files, 4096);
    std::fs::create_dir_all(&packed.dest).unwrap();
    std::fs::write(packed.dest.join("f.bin"), b"someone else's file").unwrap();

    let e = packed
        .restore(RestoreConfig::for_this_machine())
        .unwrap_err()
        .to_string();
    assert!(e.contains("f.bin") && e.contains("already exists"), "{e}");
    assert_eq!(entries(&packed.dest), ["f.bin"], "nothing else was written");
    assert_eq!(
        std::fs::read(packed.dest.join("f.bin")).unwrap(),
        b"someone else's file"
    );

    let keep = RestoreConfig {
        existing: Existing::KeepIdentical,
        ..RestoreConfig::for_this_machine()
    };
    let e = packed.restore(keep.clone()).unwrap_err().to_string();
    assert!(e.contains("f.bin"), "a different file is not kept: {e}");

    let replace = RestoreConfig {
        existing: Existing::Overwrite,
        ..RestoreConfig::for_this_machine()
    };
    let delivered = packed.restore(replace).unwrap();
    assert_eq!(delivered.files, 2);
    assert!(std::fs::read(packed.dest.join("f.bin")).unwrap() == files[0].1);

    // Now identical: kept, not written again.
    let delivered = packed.restore(keep.clone()).unwrap();
    assert_eq!((delivered.files, delivered.already), (0, 2));

    // Identical but with another name for its bytes (a hard link elsewhere): not kept as
    // delivered, since it could be changed through that name.
    let elsewhere = packed.dest.parent().unwrap().join("another-name");
    std::fs::hard_link(packed.dest.join("f.bin"), &elsewhere).unwrap();
    let e = packed.restore(keep).unwrap_err().to_string();
    assert!(e.contains("f.bin") && e.contains("2 hard links"), "{e}");
    std::fs::remove_file(&elsewhere).unwrap();
}
