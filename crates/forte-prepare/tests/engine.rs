//! The prepare engine on its own, into a directory sink: what one failing file does to the
//! others, and what a tight memory budget does to many parts.

use forte_format::keys::generate;
use forte_format::{EdgeKey, Recipients};
use forte_prepare::{discover, DirSink, Prepare, PrepareConfig, PrepareJob};

fn setup() -> (tempfile::TempDir, Recipients, EdgeKey) {
    let dir = tempfile::tempdir().unwrap();
    let keys = generate(&dir.path().join("keys")).unwrap();
    let recipients = Recipients::load(&keys.core_pub).unwrap();
    let key = EdgeKey::load(&keys.edge_key).unwrap();
    (dir, recipients, key)
}

/// `bytes` as src/big.bin under `dir`, discovered: the jobs of a pass over it.
fn one_file(dir: &std::path::Path, bytes: &[u8]) -> Vec<PrepareJob> {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("big.bin"), bytes).unwrap();
    discover(&src)
        .unwrap()
        .files
        .into_iter()
        .map(PrepareJob::fresh)
        .collect()
}

#[test]
fn a_file_that_fails_fails_alone_and_leaves_no_object() {
    let (dir, recipients, key) = setup();
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for name in ["a.bin", "gone.bin", "c.bin"] {
        std::fs::write(src.join(name), vec![7u8; 50_000]).unwrap();
    }
    let jobs: Vec<PrepareJob> = discover(&src)
        .unwrap()
        .files
        .into_iter()
        .map(PrepareJob::fresh)
        .collect();
    // Removed between discovery and reading, as a file deleted while a batch waits.
    std::fs::remove_file(src.join("gone.bin")).unwrap();
    let out = dir.path().join("out");
    let sink = DirSink::create(&out).unwrap();
    let config = PrepareConfig {
        part_size: 8192,
        ..PrepareConfig::for_this_machine()
    };
    let outcomes = Prepare::new(config, &recipients, &key).run(jobs, &sink);

    let failed: Vec<_> = outcomes.iter().filter(|o| o.error.is_some()).collect();
    assert_eq!(failed.len(), 1, "{outcomes:?}");
    assert_eq!(failed[0].path, "gone.bin");
    let error = failed[0].error.as_deref().unwrap();
    assert!(error.contains("gone.bin"), "{error}");
    assert!(
        failed[0].inventory_entry().is_none(),
        "a failed file is not inventoried"
    );
    assert!(
        !out.join(failed[0].id.to_string()).exists(),
        "its object was removed"
    );
    for ok in outcomes.iter().filter(|o| o.error.is_none()) {
        let object = out.join(ok.id.to_string());
        assert!(object.join("manifest.age").exists(), "{}", ok.path);
        // 50 000 bytes in parts of 8 KiB: seven parts.
        let parts = std::fs::read_dir(&object)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().starts_with("part-")
            })
            .count();
        assert_eq!(parts, 7, "{}", ok.path);
        assert_eq!(ok.size, 50_000);
        assert!(ok.inventory_entry().is_some());
    }
}

#[test]
fn many_parts_pass_a_budget_of_one_part_in_flight() {
    let (dir, recipients, key) = setup();
    let bytes: Vec<u8> = (0..1_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let jobs = one_file(dir.path(), &bytes);
    let out = dir.path().join("out");
    let sink = DirSink::create(&out).unwrap();
    let config = PrepareConfig {
        part_size: 4096,
        cpu: 2,
        parts_in_flight: 1,
        ..PrepareConfig::for_this_machine()
    };
    let prepare = Prepare::new(config, &recipients, &key);
    let outcomes = prepare.run(jobs, &sink);
    assert!(outcomes[0].error.is_none(), "{outcomes:?}");
    let expected = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    assert_eq!(outcomes[0].sha256.as_deref(), Some(expected.as_str()));
    let raw = prepare
        .totals
        .raw_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(raw, 1_000_000, "every byte read once");
}

/// A sink whose uploads each wait, as on a long link, until `want` are under way at once (or
/// a while has passed), and which keeps the most it saw at once.
struct SlowLink {
    inner: DirSink,
    want: usize,
    /// The sink's gate, raised to `want` at the first upload as a sender's tuner does once it
    /// has measured the link.
    gate: std::sync::Arc<forte_pipeline::Gate>,
    busy: parking_lot::Mutex<(usize, usize)>,
    changed: parking_lot::Condvar,
}

impl forte_prepare::Sink for SlowLink {
    fn put_part(
        &self,
        id: forte_format::ObjectId,
        index: u32,
        part_size: u64,
        sealed: &[u8],
        sha256: &str,
    ) -> anyhow::Result<()> {
        self.gate.set_limit(self.want);
        let mut busy = self.busy.lock();
        busy.0 += 1;
        busy.1 = busy.1.max(busy.0);
        self.changed.notify_all();
        let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
        while busy.1 < self.want && !self.changed.wait_until(&mut busy, until).timed_out() {}
        busy.0 -= 1;
        drop(busy);
        self.inner.put_part(id, index, part_size, sealed, sha256)
    }
    fn put_manifest(&self, manifest: &forte_format::Manifest, sealed: &[u8]) -> anyhow::Result<()> {
        self.inner.put_manifest(manifest, sealed)
    }
    fn done(&self, outcomes: &[forte_prepare::FileOutcome]) {
        self.inner.done(outcomes)
    }
}

#[test]
fn every_upload_the_tuner_adds_gets_a_part_whatever_the_budget_of_parts() {
    let (dir, recipients, key) = setup();
    let jobs = one_file(dir.path(), &[3u8; 16 * 4096]);
    let uploads = 6;
    let gate = forte_pipeline::Gate::new(1, uploads);
    let sink = SlowLink {
        inner: DirSink::create(&dir.path().join("out")).unwrap(),
        want: uploads,
        gate: gate.clone(),
        busy: Default::default(),
        changed: Default::default(),
    };
    let config = PrepareConfig {
        part_size: 4096,
        cpu: 2,
        parts_in_flight: 1,
        sink: gate,
        ..PrepareConfig::for_this_machine()
    };
    let outcomes = Prepare::new(config, &recipients, &key).run(jobs, &sink);
    assert!(outcomes[0].error.is_none(), "{outcomes:?}");
    let most = sink.busy.lock().1;
    assert_eq!(most, uploads, "uploads under way at once, of {uploads}");
}
