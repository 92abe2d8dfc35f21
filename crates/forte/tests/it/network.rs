//! Edge → relay → core with the real binary in three roles, over real TLS on loopback.

use std::path::Path;

use crate::common::site::*;
use crate::common::*;

fn make_batches(inbox: &Path) {
    for (batch, bags) in [
        ("truck-7-run-1", 3usize),
        ("truck-7-run-2", 1),
        ("truck-9-run-1", 2),
    ] {
        let dir = inbox.join(batch);
        for i in 0..bags {
            write(
                &dir.join(format!("bags/{i:03}.bag")),
                &sample_bytes((5 << 20) / 2 + i * 1000, i as u64 + 1),
            );
        }
        write(&dir.join("logs/vehicle.log"), &sample_bytes(350_000, 99));
        write(&dir.join(".ready"), b"");
    }
}

fn json(out: &str) -> serde_json::Value {
    crate::common::strict_json(out)
}

#[test]
fn batches_arrive_identical_under_the_layout_and_exactly_once() {
    end_to_end(Site::new());
}

#[test]
fn end_to_end_with_the_catalogue_on_postgresql() {
    if let Some(site) = Site::with_postgres() {
        end_to_end(site);
    }
}

fn end_to_end(site: Site) {
    let inbox = site.root.join("inbox");
    make_batches(&inbox);

    let sent = json(&ok(&site.send(&["--part-size", "1MiB", "--json", "-q"])));
    let batches = sent["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 3);
    assert!(
        batches
            .iter()
            .all(|b| b["failed"] == 0 && b["sent"] == b["files"]),
        "{sent:#}"
    );

    ok(&site.pull());
    let dest = site.root.join("dest/site-a");
    for batch in ["truck-7-run-1", "truck-7-run-2", "truck-9-run-1"] {
        let mut expected = tree(&inbox.join(batch));
        expected.remove(".ready");
        assert_eq!(tree(&dest.join(batch)), expected, "{batch}");
    }
    // Acknowledged: the relay holds nothing any more.
    assert!(
        site.relay_objects().is_empty(),
        "{:?}",
        site.relay_objects()
    );

    // Running both again moves nothing.
    let again = json(&ok(&site.send(&["--json", "-q"])));
    assert!(again["batches"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| b["sent"] == 0 && b["already_at_relay"] == b["files"]));
    let out = ok(&site.pull());
    assert!(out.contains("nothing waiting"), "{out}");

    // The catalogues: every batch sent and delivered, every file with both hashes.
    let edge: serde_json::Value = json(&site.status(&site.edge_catalog, &["--json"]));
    let core: serde_json::Value = json(&site.status(&site.core_catalog, &["--json"]));
    let of_role = |v: &serde_json::Value, role: &str| -> Vec<serde_json::Value> {
        v["batches"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["batch"]["role"] == role)
            .cloned()
            .collect()
    };
    let (sent, delivered) = (of_role(&edge, "edge"), of_role(&core, "core"));
    assert_eq!(sent.len(), 3, "{edge:#}");
    assert_eq!(delivered.len(), 3, "{core:#}");
    assert!(sent.iter().all(|b| b["batch"]["state"] == "sent"));
    assert!(delivered.iter().all(|b| b["batch"]["state"] == "delivered"));
    for b in &delivered {
        for f in b["files"].as_array().unwrap() {
            assert_eq!(f["state"], "acknowledged", "{f:#}");
            assert_eq!(f["raw_sha256"].as_str().unwrap().len(), 64);
        }
    }
    // Utilisation was sampled on both nodes while they worked.
    for (catalog, role) in [(&site.edge_catalog, "edge@"), (&site.core_catalog, "core@")] {
        let usage = json(&site.status(catalog, &["--usage", "--json"]));
        let mine: Vec<_> = usage
            .as_array()
            .unwrap()
            .iter()
            .filter(|u| u["node"].as_str().unwrap().starts_with(role))
            .collect();
        assert!(!mine.is_empty(), "no {role} samples: {usage:#}");
        for u in mine {
            let cpu = u["cpu_percent"].as_f64().unwrap();
            assert!(
                (0.0..=100.0).contains(&cpu) && u["memory_used"].as_i64().unwrap() > 0,
                "{u:#}"
            );
        }
    }
    // A file's lineage, from discovery at the edge to acknowledgement at the core.
    let text = site.status(
        &site.core_catalog,
        &["--file", "site-a/truck-7-run-1/bags/000.bag"],
    );
    assert!(
        text.contains("delivered to site-a/truck-7-run-1/bags/000.bag"),
        "{text}"
    );
    for state in ["delivered", "acknowledged", " UTC"] {
        assert!(text.contains(state), "{state} in {text}");
    }
    if site.edge_catalog == site.core_catalog {
        // One shared catalogue: the core's view of the file includes the edge's events.
        for state in ["discovered", "uploaded part 0", "sealed part 2"] {
            assert!(text.contains(state), "{state} in {text}");
        }
    }
    let text = site.status(&site.edge_catalog, &["--file", "bags/000.bag"]);
    for state in ["discovered", "uploaded part 0", "sealed part 2", "sealed"] {
        assert!(text.contains(state), "{state} in {text}");
    }
}

#[test]
fn a_part_damaged_at_the_relay_is_refused_reported_and_sent_again() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("run/big.bag"), &sample_bytes(4 << 20, 5));
    write(&inbox.join("run/.ready"), b"");
    ok(&site.send(&["--part-size", "1MiB", "-q"]));

    let victim = site
        .relay_objects()
        .into_iter()
        .find(|p| p.ends_with("part-000002.zst.age"))
        .unwrap();
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[1000] ^= 0x40;
    std::fs::write(&victim, bytes).unwrap();

    let err = fails(&site.pull());
    assert!(
        err.contains("big.bag")
            && err.contains("part 2")
            && err.contains("ciphertext SHA-256 mismatch"),
        "{err}"
    );
    assert!(err.contains("reported damaged to the relay"), "{err}");
    assert!(is_empty_dir(&site.root.join("dest")) || tree(&site.root.join("dest")).is_empty());
    assert!(!victim.exists(), "the relay dropped the damaged part");

    // The sender resumes: only the dropped part is uploaded again, and the file sealed again.
    let held = site.relay_object_lengths();
    let resent = json(&ok(&site.send(&["--part-size", "1MiB", "--json", "-q"])));
    let sealed = resent["batches"][0]["sealed_bytes"].as_u64().unwrap();
    // The part is compressed again (at a level that may differ), so its length is measured.
    let now = site.relay_object_lengths();
    let part_length = now[&victim];
    let manifest = now
        .iter()
        .find(|(path, _)| path.ends_with("manifest.age"))
        .map(|(_, len)| *len)
        .unwrap();
    assert!(
        held.iter()
            .all(|(path, len)| now.get(path) == Some(len) || path.ends_with("manifest.age")),
        "the other parts were left as they were"
    );
    assert_eq!(
        sealed,
        part_length + manifest,
        "exactly the dropped part ({part_length} bytes) and the manifest ({manifest}) were sent again"
    );

    ok(&site.pull());
    assert_eq!(
        std::fs::read(site.root.join("dest/site-a/run/big.bag")).unwrap(),
        std::fs::read(inbox.join("run/big.bag")).unwrap()
    );
}

#[test]
fn a_batch_signed_by_an_untrusted_edge_is_not_delivered() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("run/file.bin"), b"payload");
    write(&inbox.join("run/.ready"), b"");
    let intruder = keygen(&site.root.join("intruder"));
    ok(&site.send_signed_by(&intruder));
    let err = fails(&site.pull());
    assert!(err.contains("not among the trusted edge keys"), "{err}");
    assert!(!site.root.join("dest/site-a").exists());
    assert!(
        !site.relay_objects().is_empty(),
        "nothing is acknowledged, so the relay keeps it"
    );
}

#[test]
fn batches_wait_until_they_settle_or_are_marked_ready() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("fresh/file.bin"), b"still being written");
    let out = ok(&site.send(&["--settle", "3600"]));
    assert!(out.contains("batch fresh: not ready"), "{out}");
    assert!(site.relay_objects().is_empty());
    let out = ok(&site.send(&["--settle", "0"]));
    assert!(out.contains("batch fresh: sent 1 of 1 files"), "{out}");
}

#[test]
fn a_second_destination_gets_the_same_files_before_the_relay_may_delete() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    make_batches(&inbox);
    ok(&site.send(&["--part-size", "1MiB", "-q"]));
    let copy = site.root.join("analysts");
    let mut pull = site.pull();
    pull.extend(args!["--copy-to", &copy]);
    ok(&pull);
    let archive = delivered_tree(&site.root.join("dest"));
    assert_eq!(archive.len(), 9);
    assert_eq!(tree(&copy), archive);
    assert!(site.relay_objects().is_empty());
}

/// The relay's sealed objects of site-a by the batch they were sealed in: batch id → object ids.
fn relay_batches(site: &Site) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut batches = std::collections::BTreeMap::<String, Vec<String>>::new();
    let meta = site.relay.store.join("sites/site-a/meta");
    for o in std::fs::read_dir(meta).unwrap().flatten() {
        let sealed: serde_json::Value =
            json(&std::fs::read_to_string(o.path().join("sealed.json")).unwrap());
        batches
            .entry(sealed["batch"].as_str().unwrap().to_string())
            .or_default()
            .push(sealed["id"].as_str().unwrap().to_string());
    }
    batches
}

/// Moves an object's directories at the relay (its data and its records) between two stores.
fn move_object(from: &Path, to: &Path, id: &str) {
    for kind in ["objects", "meta"] {
        std::fs::create_dir_all(to.join(kind)).unwrap();
        std::fs::rename(from.join(kind).join(id), to.join(kind).join(id)).unwrap();
    }
}

#[test]
fn a_relay_that_drops_or_injects_an_object_of_a_sealed_batch_delivers_nothing_of_it() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    for (batch, files) in [("three", 3), ("other", 1)] {
        for i in 0..files {
            write(
                &inbox.join(batch).join(format!("{i}.bin")),
                &sample_bytes(200_000 + i, i as u64),
            );
        }
        write(&inbox.join(batch).join(".ready"), b"");
    }
    // Each file an object of its own: one of three is dropped (bundles: tests/it/bundles.rs).
    ok(&site.send(&["-q", "--bundle-below", "0"]));
    let batches = relay_batches(&site);
    let (three, other) = {
        let mut by_size: Vec<_> = batches.iter().collect();
        by_size.sort_by_key(|(_, ids)| ids.len());
        (by_size[1], by_size[0])
    };
    assert_eq!((three.1.len(), other.1.len()), (3, 1), "{batches:?}");
    let store = site.relay.store.join("sites/site-a");
    let aside = site.root.join("aside");
    let dest = site.root.join("dest/site-a");

    // Omission: the relay drops one object of the sealed batch. Every other manifest verifies,
    // but the batch's signed inventory names the one missing.
    move_object(&store, &aside, &three.1[0]);
    move_object(&store, &aside, &other.1[0]);
    let err = fails(&site.pull());
    assert!(
        err.contains(&three.1[0])
            && err.contains("listed in the signed inventory")
            && err.contains("missing"),
        "{err}"
    );
    assert!(
        !dest.join("three").exists(),
        "nothing of the batch is visible"
    );
    assert_eq!(site.relay_objects().len(), 2 * 2, "nothing acknowledged");

    // Injection: an object of another batch of the same edge (correctly signed) is listed in
    // this batch.
    move_object(&aside, &store, &three.1[0]);
    move_object(&aside, &store, &other.1[0]);
    let record = store.join("meta").join(&other.1[0]).join("sealed.json");
    let original = std::fs::read_to_string(&record).unwrap();
    std::fs::write(
        &record,
        original.replace(other.0.as_str(), three.0.as_str()),
    )
    .unwrap();
    let batch_record = store.join("batches").join(format!("{}.json", three.0));
    let mut members: Vec<String> = json(&std::fs::read_to_string(&batch_record).unwrap())
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let sealed_members = members.clone();
    members.push(other.1[0].clone());
    std::fs::write(&batch_record, serde_json::to_vec(&members).unwrap()).unwrap();
    let err = fails(&site.pull());
    assert!(
        err.contains(&other.1[0]) && err.contains("not in the signed inventory"),
        "{err}"
    );
    assert!(
        !dest.exists() || visible(&dest).is_empty(),
        "{:?}",
        visible(&dest)
    );

    // Undone, both batches arrive whole.
    std::fs::write(&record, original).unwrap();
    std::fs::write(&batch_record, serde_json::to_vec(&sealed_members).unwrap()).unwrap();
    ok(&site.pull());
    for batch in ["three", "other"] {
        let mut expected = tree(&inbox.join(batch));
        expected.remove(".ready");
        assert_eq!(tree(&dest.join(batch)), expected, "{batch}");
    }
}

/// Bytes no codec can shrink, so a test controls what the relay must hold.
fn incompressible(len: usize, seed: u64) -> Vec<u8> {
    use sha2::Digest;
    (0..len.div_ceil(32) as u64)
        .flat_map(|i| sha2::Sha256::digest([seed.to_le_bytes(), i.to_le_bytes()].concat()))
        .take(len)
        .collect()
}

#[test]
fn a_batch_larger_than_the_relay_fails_at_once_and_the_edge_cancels_it() {
    let site = Site::with_relay_flags(&["--quota-per-site", "1MiB"]);
    let inbox = site.root.join("inbox");
    for i in 0..3 {
        write(
            &inbox.join(format!("huge/{i}.bin")),
            &incompressible(500_000, i),
        );
    }
    write(&inbox.join("huge/.ready"), b"");
    let started = std::time::Instant::now();
    // Each file an object of its own, so that the relay takes some before it is full.
    let err = fails(&site.send(&["-q", "--bundle-below", "0"]));
    let seconds = started.elapsed().as_secs_f64();
    assert!(
        err.contains("nothing in it is waiting for the core") && err.contains("--cancel"),
        "{err}"
    );
    assert!(
        !err.contains("retrying"),
        "a full relay that nothing frees is not retried: {err}"
    );
    assert!(seconds < 20.0, "took {seconds:.1} s to fail");

    // The operator sees what the relay holds, and cancels the batch from the edge.
    let store = site.relay.store.clone();
    let listed = ok(&args!["relay-store", "list", "--store", &store]);
    assert!(
        listed.contains("site site-a: ")
            && (listed.contains("(being sent)") || listed.contains("uploads not sealed yet")),
        "{listed}"
    );
    // The same --bundle-below as the send, so that cancel names the same objects.
    let out = ok(&site.send(&["--cancel", "huge", "--bundle-below", "0"]));
    assert!(
        out.contains("batch huge: cancelled; the relay deleted"),
        "{out}"
    );
    assert!(
        site.relay_objects().is_empty(),
        "{:?}",
        site.relay_objects()
    );
    let listed = ok(&args!["relay-store", "list", "--store", &store]);
    assert!(listed.contains("holds nothing"), "{listed}");

    // Later runs skip the cancelled batch and send the others.
    write(&inbox.join("small/a.txt"), b"a small batch\n");
    write(&inbox.join("small/.ready"), b"");
    let out = ok(&site.send(&["-q"]));
    assert!(out.contains("batch huge: cancelled"), "{out}");
    ok(&site.pull());
    let dest = site.root.join("dest/site-a");
    assert!(dest.join("small/a.txt").exists());
    assert!(!dest.join("huge").exists());
    assert!(inbox.join("huge/0.bin").exists(), "the source is untouched");

    // A watching sender, which asks the relay every pass about the batches it sent, does not
    // take the cancelled batch (whose objects the relay no longer holds) for a lost one.
    let log = site.root.join("send.log");
    let _sender = spawn_logged(&site.send(&["--watch", "--interval", "1"]), &log);
    for name in ["later", "latest"] {
        write(
            &inbox.join(format!("{name}/a.txt")),
            b"another small batch\n",
        );
        write(&inbox.join(format!("{name}/.ready")), b"");
        let said = || std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            wait_for(30, || said().contains(&format!("batch {name}: sent"))),
            "{}",
            said()
        );
    }
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(!said.contains("no longer holds"), "{said}");
    assert!(!said.contains("batch huge: sent"), "{said}");
}

/// `pull --copy-to` acknowledges only once the second copy exists: when it cannot be made
/// (its directory lies under a regular file, so it cannot be created, even by root), the pull
/// fails naming it and the relay keeps every object; a later pull with a working second
/// destination makes the copy and only then acknowledges.
#[test]
fn a_second_copy_that_cannot_be_made_keeps_everything_at_the_relay() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    make_batches(&inbox);
    ok(&site.send(&["--part-size", "1MiB", "-q"]));
    let at_relay = site.relay_objects();
    assert!(!at_relay.is_empty());

    let blocker = site.root.join("not-a-directory");
    write(
        &blocker,
        b"a regular file where the copy's parent directory should be\n",
    );
    let broken = blocker.join("analysts");
    let mut pull = site.pull();
    pull.extend(args!["--copy-to", &broken]);
    let err = fails(&pull);
    assert!(err.contains("not-a-directory"), "the copy is named: {err}");
    assert_eq!(
        site.relay_objects(),
        at_relay,
        "acknowledged although the second copy was not made: {err}"
    );
    assert!(!broken.exists());
    let dest = site.root.join("dest");
    assert_no_staging(&dest, "after a pull whose second copy failed");

    let copy = site.root.join("analysts");
    let mut pull = site.pull();
    pull.extend(args!["--copy-to", &copy]);
    ok(&pull);
    let archive = delivered_tree(&dest);
    assert_eq!(archive.len(), 9, "{archive:?}");
    assert_eq!(tree(&copy), archive);
    for batch in ["truck-7-run-1", "truck-7-run-2", "truck-9-run-1"] {
        let mut expected = tree(&inbox.join(batch));
        expected.remove(".ready");
        assert_eq!(tree(&copy.join("site-a").join(batch)), expected, "{batch}");
    }
    assert!(
        site.relay_objects().is_empty(),
        "{:?}",
        site.relay_objects()
    );
    assert_no_staging(&dest, "after a pull");
}

#[test]
fn a_puller_killed_after_the_relay_took_its_acknowledgement_learns_it_at_the_next_start() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    make_batches(&inbox);
    ok(&site.send(&["-q"]));
    ok(&site.pull());
    let pending = "SELECT COUNT(*) FROM files WHERE state <> 'acknowledged'";
    assert_eq!(sqlite(&site.core_catalog, pending), "0");
    // As if the puller died after the relay took the acknowledgement, before recording it.
    sqlite(
        &site.core_catalog,
        "UPDATE files SET state = 'delivered' WHERE state = 'acknowledged'",
    );
    assert_ne!(sqlite(&site.core_catalog, pending), "0");
    // The acknowledgement given again carries the receipts the core signed the first time.
    let receipts = site.relay.store.join("sites/site-a/receipts");
    let signed = visible(&receipts);
    assert_eq!(signed.len(), 3, "a receipt per batch");
    std::fs::remove_dir_all(&receipts).unwrap();
    let out = ok(&site.pull());
    assert!(out.contains("nothing waiting"), "{out}");
    assert_eq!(
        sqlite(&site.core_catalog, pending),
        "0",
        "the relay's acknowledgement was not learnt"
    );
    assert_eq!(visible(&receipts), signed);
}

/// What is already at the second destination: an identical file (an earlier copy whose
/// acknowledgement was lost) is kept and the batch goes through; a different one is never
/// overwritten, the batch is not acknowledged, and the message names the file.
#[test]
fn the_second_copy_keeps_an_identical_file_and_refuses_a_different_one() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("run/a.bin"), b"the first file\n");
    write(&inbox.join("run/.ready"), b"");
    write(&inbox.join("run2/b.bin"), b"the second file\n");
    write(&inbox.join("run2/.ready"), b"");
    ok(&site.send(&["-q"]));
    let copy = site.root.join("analysts");
    write(&copy.join("site-a/run/a.bin"), b"the first file\n");
    write(&copy.join("site-a/run2/b.bin"), b"something else\n");
    let mut pull = site.pull();
    pull.extend(args!["--copy-to", &copy]);
    let err = fails(&pull);
    let different = copy.join("site-a/run2/b.bin");
    assert!(
        err.contains(&format!(
            "{} exists with other contents; refusing to overwrite it",
            different.display()
        )),
        "{err}"
    );
    assert_eq!(std::fs::read(&different).unwrap(), b"something else\n");
    assert_eq!(
        std::fs::read(site.root.join("dest/site-a/run/a.bin")).unwrap(),
        b"the first file\n",
        "the batch whose copy was already in place was delivered"
    );
    assert_eq!(
        site.relay_objects().len(),
        2,
        "only the refused batch's object and manifest stay at the relay"
    );
}

/// Staging directories a killed puller left behind are removed, and counted, when the next
/// pull starts; what they held never becomes visible.
#[test]
fn a_pull_removes_and_counts_the_staging_directories_a_killed_one_left() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("run/a.bin"), b"payload\n");
    write(&inbox.join("run/.ready"), b"");
    ok(&site.send(&["-q"]));
    let dest = site.root.join("dest");
    for name in [".forte-staging-0a1b", ".forte-staging-2c3d"] {
        write(&dest.join(name).join("half-written"), b"partial");
    }
    let out = run(&site.pull());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("removed 2 staging directories left by an interrupted pull"),
        "{stderr}"
    );
    assert_no_staging(&dest, "after a pull that found stale staging directories");
    assert_eq!(
        visible(&dest).len(),
        1,
        "only the delivered file: {:?}",
        visible(&dest)
    );
}

#[test]
fn a_relay_that_drops_a_bundle_delivers_nothing_and_names_the_files_in_it() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    for name in ["a.txt", "logs/b.txt", "logs/c.txt"] {
        write(&inbox.join("mixed").join(name), name.as_bytes());
    }
    write(&inbox.join("mixed/big.bin"), &sample_bytes(2 << 20, 5));
    write(&inbox.join("mixed/.ready"), b"");
    ok(&site.send(&["-q"]));
    let batches = relay_batches(&site);
    let ids = batches.values().next().unwrap();
    assert_eq!(
        ids.len(),
        2,
        "one bundle of three files and the large file: {batches:?}"
    );
    let store = site.relay.store.join("sites/site-a");
    let part_len = |id: &String| {
        std::fs::metadata(store.join("objects").join(id).join("part-000000.zst.age"))
            .unwrap()
            .len()
    };
    let bundle = ids.iter().min_by_key(|id| part_len(id)).unwrap();
    move_object(&store, &site.root.join("aside"), bundle);
    let err = fails(&site.pull());
    for name in ["a.txt", "logs/b.txt", "logs/c.txt"] {
        assert!(
            err.contains(name) && err.contains("missing"),
            "{name}: {err}"
        );
    }
    assert!(
        !site.root.join("dest/site-a/mixed").exists(),
        "nothing of the batch is visible"
    );
}

#[test]
fn a_send_asks_the_relay_about_all_its_batches_in_one_query() {
    // Each status query waits a round trip: batches asked about one after another, or eight
    // at a time, kept a long link idle before the first byte went.
    let mut site = Site::new();
    let log = site.root.join("relay.log");
    site.relay = start_relay_logging_to(&site.root, &log);
    let inbox = site.root.join("inbox");
    for b in 0..12u64 {
        let dir = inbox.join(format!("run-{b:02}"));
        write(&dir.join("data.bin"), &sample_bytes(300_000, b));
        write(&dir.join("notes.txt"), &sample_bytes(2_000, b + 100));
        write(&dir.join(".ready"), b"");
    }
    let asked = || {
        let log = std::fs::read_to_string(&log).unwrap();
        log.lines()
            .filter(|l| l.contains("status asked"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    ok(&site.send(&["-q"]));
    assert_eq!(asked().len(), 1, "{:#?}", asked());
    // A second run finds all of it at the relay, with one query too, and sends nothing.
    let out = ok(&site.send(&[]));
    assert!(out.contains("sent 0 of 2 files (2 sent before"), "{out}");
    assert_eq!(asked().len(), 2, "{:#?}", asked());
}

#[test]
fn a_bandwidth_limit_paces_the_upload_and_every_byte_arrives() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    // Incompressible, so about as many sealed bytes cross the link as were read.
    write(&inbox.join("run-01/data.bin"), &random_bytes(6_000_000));
    write(&inbox.join("run-01/small.txt"), &sample_bytes(40_000, 3));
    write(&inbox.join("run-01/.ready"), b"");
    let started = std::time::Instant::now();
    let out = ok(&site.send(&["--bwlimit", "2MB"]));
    let took = started.elapsed();
    // 6 MB at 2 MB/s cannot go in under 3 s less the 50 ms burst, whatever the machine; on
    // loopback without the limit the same send takes well under a second.
    assert!(
        took >= std::time::Duration::from_millis(2900),
        "sent in {took:?}: {out}"
    );
    ok(&site.pull());
    let mut expected = tree(&inbox.join("run-01"));
    expected.remove(".ready");
    assert_eq!(tree(&site.root.join("dest/site-a/run-01")), expected);
}

#[test]
fn a_bad_bandwidth_limit_is_refused_before_anything_is_sent() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("run-01/data.bin"), &sample_bytes(100_000, 1));
    write(&inbox.join("run-01/.ready"), b"");
    let err = fails(&site.send(&["--bwlimit", "08:00,2MB 25:00,off"]));
    assert!(
        err.contains("\"25:00,off\": the time is not HH:MM"),
        "{err}"
    );
    // Nothing reached the relay: a second send with no limit sends the whole batch.
    let out = ok(&site.send(&[]));
    assert!(out.contains("sent 1 of 1 files"), "{out}");
}

#[test]
fn uploads_sharing_a_low_limit_are_not_timed_out_by_it() {
    // Four 1.5 MB objects on four connections at 1 MB/s: each upload gets a quarter of the
    // limit and takes about 6 s, longer than the 2 s timeout plus its own bytes at the
    // whole limit. Pacing must never turn into a timeout (and a retry, and a failure).
    let site = Site::new();
    let inbox = site.root.join("inbox");
    for i in 0..4u64 {
        write(
            &inbox.join(format!("run-01/part-{i}.bin")),
            &random_bytes(1_500_000),
        );
    }
    write(&inbox.join("run-01/.ready"), b"");
    let out = run(&site.send(&["--bwlimit", "1MB", "--connections", "4", "--timeout", "2"]));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("retrying"), "{stderr}");
    assert!(
        stdout.contains("sent 4 of 4 files (0 sent before, 0 failed)"),
        "{stdout}"
    );
    ok(&site.pull());
    let mut expected = tree(&inbox.join("run-01"));
    expected.remove(".ready");
    assert_eq!(tree(&site.root.join("dest/site-a/run-01")), expected);
}

#[test]
fn a_daemon_killed_at_any_moment_has_kept_its_tuning_history() {
    // Batches of 3 MB arrive every second to a daemon held at 2 MB/s, so its uploads always
    // have work: its one pass lasts as long as the daemon, and its tuner judges intervals as
    // batches come. It is killed with SIGKILL; the next run starts from the history it kept.
    // (History was written when a pass ended, which a daemon's does only when it stops
    // cleanly: the next run started from the round trip again.)
    let site = Site::new();
    let inbox = site.root.join("inbox");
    let log = site.root.join("send.log");
    let mut daemon = spawn_logged(
        &site.send(&[
            "--watch",
            "--interval",
            "1",
            "--target-rate",
            "2MB",
            "--part-size",
            "1MiB",
        ]),
        &log,
    );
    // 14 batches, 21 s at 2 MB/s: after the start (not judged) and a first interval that
    // brings the uploads down to what the memory budget lets work (not a best either), a few
    // intervals are judged even on a loaded machine.
    for k in 0..14 {
        let batch = inbox.join(format!("run-{k:02}"));
        write(&batch.join("data.bin"), &random_bytes(3_000_000));
        write(&batch.join(".ready"), b"");
        std::thread::sleep(std::time::Duration::from_millis(1000));
    }
    let passes = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_for(60, || passes().matches("sent 1 of 1 files").count() == 14),
        "{}",
        passes()
    );
    kill(&mut daemon);
    write(&inbox.join("run-last/data.bin"), &random_bytes(3_000_000));
    write(&inbox.join("run-last/.ready"), b"");
    send_starts_from_history(
        &site,
        &format!("the daemon kept no history\ndaemon: {}", passes()),
    );
}

/// A `send` of what the inbox holds: it succeeds and its tuner starts from this relay's
/// history; `context` is printed if not.
fn send_starts_from_history(site: &Site, context: &str) {
    let next = run(&site.send(&["--part-size", "1MiB"]));
    let stderr = String::from_utf8_lossy(&next.stderr);
    assert!(next.status.success(), "{context}\n{stderr}");
    assert!(
        stderr.contains(&format!("start: history of {}", site.relay.url)),
        "{context}\n{stderr}"
    );
}

#[test]
fn auto_connections_start_from_the_relays_history_on_the_next_run() {
    // A first send, held at 4 MB/s for about 10 s, measures one setting at least (the first
    // interval, the start, is not judged; each needs 8 requests, here 2 s of 1 MiB parts):
    // the tuner keeps it in the edge's catalogue under this relay, and the next send starts
    // from it instead of the round trip's guess. (6 s left no judged best in 2 of 6 runs of
    // the whole suite on a loaded machine.)
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("run-01/data.bin"), &random_bytes(40_000_000));
    write(&inbox.join("run-01/.ready"), b"");
    // Parts of 1 MiB finish one after another, so every interval measures some goodput.
    let first = run(&site.send(&["--target-rate", "4MB", "--part-size", "1MiB"]));
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    assert!(
        stderr.contains("uploads in flight") && stderr.contains("start: round trip"),
        "{stderr}"
    );
    write(&inbox.join("run-02/data.bin"), &random_bytes(9_000_000));
    write(&inbox.join("run-02/.ready"), b"");
    send_starts_from_history(&site, &format!("the second send; first: {stderr}"));
    // Its timeline is in the report's charts.
    let charts = site.root.join("charts");
    let text = ok(&args![
        "--catalog",
        &site.edge_catalog,
        "report",
        "--charts",
        &charts
    ]);
    assert!(text.contains("timeline, utilisation, tuning"), "{text}");
    let svg = std::fs::read_to_string(charts.join("tuning.svg")).unwrap();
    assert!(svg.contains("uploads in flight") && svg.contains("goodput"));
    assert!(svg.contains("<polyline"), "{svg}");
    ok(&site.pull());
    for batch in ["run-01", "run-02"] {
        let mut expected = tree(&inbox.join(batch));
        expected.remove(".ready");
        assert_eq!(tree(&site.root.join("dest/site-a").join(batch)), expected);
    }
}

#[test]
fn a_target_rate_holds_the_upload_at_it_and_a_bad_one_is_refused() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("run-01/data.bin"), &random_bytes(6_000_000));
    write(&inbox.join("run-01/.ready"), b"");
    let err = fails(&site.send(&["--target-rate", "0MB"]));
    assert!(err.contains("--target-rate (send.target_rate)"), "{err}");
    assert!(err.contains("sends nothing"), "{err}");
    let usage = run(&site.send(&["--connections", "none"]));
    let err = String::from_utf8_lossy(&usage.stderr);
    assert_eq!(usage.status.code(), Some(2), "{err}");
    assert!(err.contains("not a number of connections"), "{err}");
    let started = std::time::Instant::now();
    let out = ok(&site.send(&["--target-rate", "2MB", "--connections", "2"]));
    let took = started.elapsed();
    // 6 MB at 2 MB/s cannot go in under 3 s less the 50 ms burst.
    assert!(
        took >= std::time::Duration::from_millis(2900),
        "sent in {took:?}: {out}"
    );
    assert!(out.contains("sent 1 of 1 files"), "{out}");
}

/// A new edge catalogue (the old one lost) sends a batch it has no record of without asking
/// the relay first. What the relay holds of it, sealed or delivered, is not replaced: the run
/// asks, books those files as at the relay and succeeds, and the core gets every file once.
#[test]
fn a_new_catalogue_replaces_nothing_the_relay_holds() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    make_batches(&inbox);
    let send = || json(&ok(&site.send(&["--part-size", "1MiB", "--json", "-q"])));
    send();
    let objects = site.relay.store.join("sites/site-a/objects");
    let held = tree(&objects);
    let held_before = |b: &serde_json::Value| {
        b["failed"] == 0 && b["sent"] == 0 && b["already_at_relay"] == b["files"]
    };

    // Sealed, not pulled yet.
    std::fs::remove_file(&site.edge_catalog).unwrap();
    let again = send();
    let batches = again["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 3, "{again:#}");
    assert!(batches.iter().all(held_before), "{again:#}");
    assert_eq!(tree(&objects), held, "the sealed objects are as they were");
    ok(&site.pull());
    for batch in ["truck-7-run-1", "truck-7-run-2", "truck-9-run-1"] {
        let mut expected = tree(&inbox.join(batch));
        expected.remove(".ready");
        assert_eq!(tree(&site.root.join("dest/site-a").join(batch)), expected);
    }

    // Delivered and acknowledged.
    std::fs::remove_file(&site.edge_catalog).unwrap();
    let again = send();
    assert!(
        again["batches"].as_array().unwrap().iter().all(held_before),
        "{again:#}"
    );
    assert!(
        site.relay_objects().is_empty(),
        "{:?}",
        site.relay_objects()
    );
    let out = ok(&site.pull());
    assert!(out.contains("nothing waiting"), "{out}");
}

/// The relay reloads tokens.toml on SIGHUP (a new site's token works at once, the others
/// keep working), refuses a file that does not parse and keeps the tokens in force, and on
/// SIGTERM says so and ends with status 0.
#[test]
fn the_relay_reloads_its_tokens_on_sighup_and_ends_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("relay.log");
    let mut relay = start_relay_logging_to(dir.path(), &log);
    let client = |token: &str| site_client(&relay, token);
    let new_token = "site-c-edge-token-0123456789";
    assert!(client(new_token).site().is_err(), "not known yet");
    let tokens = dir.path().join("tokens.toml");
    let mut text = std::fs::read_to_string(&tokens).unwrap();
    text.push_str(&format!(
        "[[token]]\ntoken = \"{new_token}\"\nrole = \"edge\"\nsite = \"site-c\"\n"
    ));
    write(&tokens, text.as_bytes());
    let signal = |sig| unsafe { libc::kill(relay.child.id() as i32, sig) };
    signal(libc::SIGHUP);
    assert!(
        wait_for(10, || client(new_token).site().is_ok_and(|s| s == "site-c")),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(client(EDGE_TOKEN).site().unwrap(), "site-a");

    write(&tokens, b"[[token]\nthis is not toml");
    signal(libc::SIGHUP);
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_for(10, || said().contains("tokens file not reloaded")),
        "{}",
        said()
    );
    assert_eq!(
        client(new_token).site().unwrap(),
        "site-c",
        "the tokens in force stay"
    );

    signal(libc::SIGTERM);
    let mut status = None;
    assert!(
        wait_for(20, || {
            status = relay.child.try_wait().unwrap();
            status.is_some()
        }),
        "still running after SIGTERM"
    );
    assert_eq!(status.unwrap().code(), Some(0), "{}", said());
    assert!(
        said().contains("relay shutting down (SIGTERM)"),
        "{}",
        said()
    );
}

/// A relay whose connection cap does not fit in its descriptor limit says so at start, and
/// what to change, instead of failing to accept connections later without a word.
#[test]
fn a_connection_cap_beyond_the_descriptor_limit_is_refused_at_start() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("tokens.toml"),
        format!("[[token]]\ntoken = \"{EDGE_TOKEN}\"\nrole = \"edge\"\nsite = \"site-a\"\n")
            .as_bytes(),
    );
    let mut relay = forte();
    relay
        .args([
            "relay",
            "--store",
            "store",
            "--tokens",
            "tokens.toml",
            "--listen",
            "127.0.0.1:0",
        ])
        .current_dir(dir.path());
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        relay.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 600,
                rlim_max: 600,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = relay.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--max-connections 768 needs about 1024 file descriptors")
            && stderr.contains("lower --max-connections to 344 or less"),
        "{stderr}"
    );
}

/// A second SIGTERM while an upload keeps the relay in its shutdown grace ends it at once,
/// with status 1 and a line saying what the next start takes up.
#[test]
fn a_second_signal_ends_the_relay_at_once_saying_what_is_left() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("relay.log");
    let mut relay = start_relay_logging_to(dir.path(), &log);
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    let addr = relay.url.trim_start_matches("https://").to_string();
    // An upload half sent: the relay waits for it through its grace (30 s by default).
    let mut upload = tool("openssl")
        .args(["s_client", "-connect", &addr, "-quiet"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let head = format!(
        "PUT /v1/objects/{}/parts/0 HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {EDGE_TOKEN}\r\n\
         x-forte-sha256: {}\r\nContent-Length: 1000000\r\n\r\n",
        "ab".repeat(16),
        "0".repeat(64)
    );
    let stdin = upload.stdin.as_mut().unwrap();
    stdin.write_all(head.as_bytes()).unwrap();
    stdin.write_all(&[7u8; 1000]).unwrap();
    stdin.flush().unwrap();
    let spool = relay.store.join("sites/site-a/tmp");
    assert!(
        wait_for(20, || std::fs::read_dir(&spool)
            .is_ok_and(|mut d| d.next().is_some())),
        "the upload never began: {}",
        said()
    );
    let signal = |sig| unsafe { libc::kill(relay.child.id() as i32, sig) };
    signal(libc::SIGTERM);
    assert!(
        wait_for(10, || said().contains("relay shutting down")),
        "{}",
        said()
    );
    signal(libc::SIGTERM);
    let mut status = None;
    assert!(
        wait_for(5, || {
            status = relay.child.try_wait().unwrap();
            status.is_some()
        }),
        "still running after a second SIGTERM: {}",
        said()
    );
    assert_eq!(status.unwrap().code(), Some(1), "{}", said());
    assert!(
        said().contains("second signal: the relay ends at once"),
        "{}",
        said()
    );
    assert!(said().contains("removed at the next start"), "{}", said());
    let _ = upload.kill();
    let _ = upload.wait();
}

/// Connections that send nothing cannot hold the relay: one over the per-address cap is closed
/// as soon as it is accepted, one that never finishes its TLS handshake is closed at the
/// handshake timeout, and one that finished it but sends no request at the idle timeout; a
/// site's request is answered meanwhile.
#[test]
fn idle_connections_are_capped_and_closed() {
    use std::io::Read;
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let relay = start_relay_with(
        dir.path(),
        "127.0.0.1:0",
        &[
            "--handshake-timeout",
            "1s",
            "--idle-timeout",
            "2s",
            "--max-connections-per-address",
            "3",
        ],
    );
    let addr = relay.url.trim_start_matches("https://").to_string();
    let closed_within = |stream: &mut TcpStream, secs: u64| {
        stream
            .set_read_timeout(Some(Duration::from_secs(secs)))
            .unwrap();
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    };
    let mut held: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let mut over = TcpStream::connect(&addr).unwrap();
    assert!(
        closed_within(&mut over, 5),
        "the fourth connection from one address was kept"
    );
    let started = Instant::now();
    for stream in &mut held {
        assert!(
            closed_within(stream, 10),
            "a silent connection outlived the handshake timeout"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // A TLS connection that sends no request is closed at the idle timeout.
    let started = Instant::now();
    let mut quiet = tool("openssl")
        .args(["s_client", "-connect", &addr, "-quiet"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut ended = None;
    assert!(
        wait_for(15, || {
            ended = quiet.try_wait().unwrap();
            ended.is_some()
        }),
        "an idle TLS connection stayed open"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let site = site_client(&relay, EDGE_TOKEN);
    assert_eq!(site.site().unwrap(), "site-a");
}

/// The edge's client of `relay` with `token`.
fn site_client(relay: &Relay, token: &str) -> forte_relay::client::RelayClient {
    forte_relay::client::RelayClient::new(
        &forte_relay::client::RelayEndpoint {
            url: relay.url.clone(),
            token: token.into(),
            trust: forte_relay::tls::RelayTrust::Fingerprint(relay.fingerprint.clone()),
        },
        std::time::Duration::from_secs(10),
    )
    .unwrap()
}
