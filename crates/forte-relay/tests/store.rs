//! The relay's store called directly: quota accounting, idempotent uploads, clean-up, and the
//! errors that must be tolerated (a file already gone) or reported (any other failure).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use forte_format::{part_file_name, ObjectId};
use forte_relay::api::ObjectState;
use forte_relay::server::store::{Store, StoreError, Stored};

use common::{part, sha};

const SITE: &str = "site-a";

fn site_dir(root: &Path) -> PathBuf {
    root.join("sites").join(SITE)
}

fn part_path(root: &Path, id: ObjectId, index: u32) -> PathBuf {
    site_dir(root)
        .join("objects")
        .join(id.to_string())
        .join(part_file_name(index))
}

/// A store of its own in a temporary directory, with `quota` bytes per site.
fn fresh_store(quota: Option<u64>) -> (tempfile::TempDir, Store) {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path(), quota).unwrap();
    (tmp, store)
}

fn put(store: &Store, id: ObjectId, index: u32, body: &[u8]) -> Result<Stored, StoreError> {
    store.put_part(SITE, id, index, &sha(body), body)
}

/// Part `index` of `id` as the relay would send it, read whole.
fn read_part(store: &Store, id: ObjectId, index: u32) -> Result<Vec<u8>, StoreError> {
    let (mut reader, length) = store.open_part(SITE, id, index)?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut reader, &mut bytes).unwrap();
    assert_eq!(bytes.len() as u64, length, "the length given with the part");
    Ok(bytes)
}

/// Seals `id` (one part, `body`) into `batch` with a one-byte manifest.
fn seal_one(store: &Store, id: ObjectId, batch: &str, body: &[u8]) {
    store.seal(SITE, id, batch, &[part(0, body)], b"m").unwrap();
}

/// The message of an `Io` error; panics on any other outcome.
fn io_message<T: std::fmt::Debug>(result: Result<T, StoreError>) -> String {
    match result {
        Err(StoreError::Io(m)) => m,
        other => panic!("expected StoreError::Io, got {other:?}"),
    }
}

/// The message of a `NoRoom` error; panics on any other outcome.
fn no_room_message<T: std::fmt::Debug>(result: Result<T, StoreError>) -> String {
    match result {
        Err(StoreError::NoRoom(m)) => m,
        other => panic!("expected StoreError::NoRoom, got {other:?}"),
    }
}

/// Sets the modification time of a file or directory.
fn set_mtime(path: &Path, when: SystemTime) {
    std::fs::File::open(path)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

/// Dates an object's records (every file of its meta directory, and the directory) at `when`.
fn date_records(root: &Path, id: ObjectId, when: SystemTime) {
    let meta = site_dir(root).join("meta").join(id.to_string());
    for entry in std::fs::read_dir(&meta).unwrap() {
        set_mtime(&entry.unwrap().path(), when);
    }
    set_mtime(&meta, when);
}

#[test]
fn a_part_that_exactly_fills_the_quota_is_accepted_and_one_byte_more_is_refused() {
    let (tmp, store) = fresh_store(Some(1000));
    let id = ObjectId::random();
    // The quota is inclusive: held + part may equal it, not exceed it.
    let message = no_room_message(put(&store, id, 0, &[1u8; 1001]));
    assert!(
        message.starts_with("1001 bytes do not fit in site site-a's quota: 0 of 1000 bytes held, 1000 free, and nothing"),
        "{message}"
    );
    assert!(!part_path(tmp.path(), id, 0).exists());
    assert_eq!(put(&store, id, 0, &[1u8; 1000]).unwrap(), Stored::New);
    let message = no_room_message(put(&store, id, 1, &[2u8; 1]));
    assert!(
        message.starts_with("site site-a is at its quota (1000 of 1000 bytes held)"),
        "{message}"
    );
}

#[test]
fn a_retried_identical_part_is_already_held_and_charged_once() {
    let (_tmp, store) = fresh_store(Some(1000));
    let id = ObjectId::random();
    assert_eq!(put(&store, id, 0, &[1u8; 500]).unwrap(), Stored::New);
    assert_eq!(
        put(&store, id, 0, &[1u8; 500]).unwrap(),
        Stored::AlreadyHeld
    );
    // 500 held, not 1000: another 500 bytes fit exactly, one more byte does not.
    assert_eq!(put(&store, id, 1, &[2u8; 500]).unwrap(), Stored::New);
    no_room_message(put(&store, id, 2, &[3u8; 1]));
}

#[test]
fn a_re_uploaded_part_of_another_length_is_charged_only_the_difference() {
    let (_tmp, store) = fresh_store(Some(1000));
    let id = ObjectId::random();
    assert_eq!(put(&store, id, 0, &[1u8; 600]).unwrap(), Stored::New);
    assert_eq!(put(&store, id, 0, &[2u8; 400]).unwrap(), Stored::New);
    assert_eq!(read_part(&store, id, 0).unwrap(), vec![2u8; 400]);
    // 400 held: 600 more fill the quota exactly, one byte more is refused.
    assert_eq!(put(&store, id, 1, &[3u8; 600]).unwrap(), Stored::New);
    let message = no_room_message(put(&store, id, 2, &[4u8; 1]));
    assert!(message.contains("(1000 of 1000 bytes held)"), "{message}");
}

#[test]
fn a_different_part_of_the_same_length_replaces_the_held_one() {
    let (_tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    assert_eq!(put(&store, id, 0, &[1u8; 100]).unwrap(), Stored::New);
    // Same index and length, intact on disk, but another hash: not the part held.
    assert_eq!(put(&store, id, 0, &[2u8; 100]).unwrap(), Stored::New);
    assert_eq!(read_part(&store, id, 0).unwrap(), vec![2u8; 100]);
    let status = store.status(SITE, id).unwrap();
    assert_eq!(status.parts, vec![part(0, &[2u8; 100])]);
}

#[test]
fn a_held_part_that_no_longer_matches_its_record_is_stored_again() {
    let (tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    let body = [7u8; 100];
    assert_eq!(put(&store, id, 0, &body).unwrap(), Stored::New);
    // As a crash between rename and flush can leave it: the record is right, the part not.
    std::fs::write(part_path(tmp.path(), id, 0), [0u8; 100]).unwrap();
    assert_eq!(put(&store, id, 0, &body).unwrap(), Stored::New);
    assert_eq!(std::fs::read(part_path(tmp.path(), id, 0)).unwrap(), body);
}

#[test]
fn a_torn_part_is_stored_again_on_a_site_more_than_half_full() {
    let (tmp, store) = fresh_store(Some(1000));
    let id = ObjectId::random();
    let body = [7u8; 600];
    assert_eq!(put(&store, id, 0, &body).unwrap(), Stored::New);
    std::fs::write(part_path(tmp.path(), id, 0), [0u8; 600]).unwrap();
    // The retry replaces 600 bytes with 600: it adds nothing to the 600 held, and must not
    // be refused as if both were held at once.
    assert_eq!(put(&store, id, 0, &body).unwrap(), Stored::New);
    assert_eq!(std::fs::read(part_path(tmp.path(), id, 0)).unwrap(), body);
    assert_eq!(put(&store, id, 1, &[8u8; 400]).unwrap(), Stored::New);
    no_room_message(put(&store, id, 2, &[9u8; 1]));
}

#[test]
fn a_part_replaced_by_a_smaller_one_on_a_full_site_is_accepted() {
    let (_tmp, store) = fresh_store(Some(1000));
    let id = ObjectId::random();
    assert_eq!(put(&store, id, 0, &[1u8; 600]).unwrap(), Stored::New);
    assert_eq!(put(&store, id, 1, &[2u8; 400]).unwrap(), Stored::New);
    // Held: 1000 of 1000. The replacement frees 100 bytes.
    assert_eq!(put(&store, id, 0, &[3u8; 500]).unwrap(), Stored::New);
    assert_eq!(put(&store, id, 2, &[4u8; 100]).unwrap(), Stored::New);
    let message = no_room_message(put(&store, id, 3, &[5u8; 1]));
    assert!(message.contains("(1000 of 1000 bytes held)"), "{message}");
}

#[test]
fn identical_bytes_uploaded_as_two_parts_are_stored_under_each_index() {
    let (_tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    let body = [9u8; 64];
    assert_eq!(put(&store, id, 0, &body).unwrap(), Stored::New);
    // Part 0 holds the same hash and length; it is not part 1.
    assert_eq!(put(&store, id, 1, &body).unwrap(), Stored::New);
    assert_eq!(read_part(&store, id, 1).unwrap(), body);
    let status = store.status(SITE, id).unwrap();
    assert_eq!(
        (status.state, status.parts),
        (ObjectState::Open, vec![part(0, &body), part(1, &body)])
    );
}

#[test]
fn a_failed_part_write_gives_back_its_quota_charge() {
    let (tmp, store) = fresh_store(Some(1000));
    let id = ObjectId::random();
    // A directory where the part's record goes: the rename onto it fails.
    let record = site_dir(tmp.path())
        .join("meta")
        .join(id.to_string())
        .join("part-000000.sha256");
    std::fs::create_dir_all(&record).unwrap();
    let message = io_message(put(&store, id, 0, &[1u8; 1000]));
    assert_eq!(
        message,
        format!(
            "part 0 of object {id}: {}: Is a directory (os error 21)",
            record.display()
        )
    );
    std::fs::remove_dir(&record).unwrap();
    // Nothing was stored, so nothing stays charged: the whole quota is still free.
    assert_eq!(put(&store, id, 0, &[1u8; 1000]).unwrap(), Stored::New);
}

#[test]
fn a_reopened_store_counts_the_bytes_already_held_against_the_quota() {
    let tmp = tempfile::tempdir().unwrap();
    let id = ObjectId::random();
    {
        let store = Store::open(tmp.path(), Some(1500)).unwrap();
        assert_eq!(put(&store, id, 0, &[1u8; 1000]).unwrap(), Stored::New);
    }
    // The usage is rebuilt from the files under objects/, not from their directories' sizes.
    let store = Store::open(tmp.path(), Some(1500)).unwrap();
    assert_eq!(put(&store, id, 1, &[2u8; 500]).unwrap(), Stored::New);
    let message = no_room_message(put(&store, id, 2, &[3u8; 1]));
    assert!(message.contains("(1500 of 1500 bytes held)"), "{message}");
}

#[test]
fn a_batch_sealed_without_an_inventory_has_none_even_after_one_with() {
    let (tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    put(&store, id, 0, b"part").unwrap();
    seal_one(&store, id, "b1", b"part");
    // No inventory file to remove: that is fine.
    store.seal_batch(SITE, "b1", &[id], None).unwrap();
    assert_eq!(store.read_inventory(SITE, "b1").unwrap(), None);

    store
        .seal_batch(SITE, "b1", &[id], Some(b"sealed inventory"))
        .unwrap();
    assert_eq!(
        store.read_inventory(SITE, "b1").unwrap().as_deref(),
        Some(&b"sealed inventory"[..])
    );
    // Sealed again without one: the old inventory goes.
    store.seal_batch(SITE, "b1", &[id], None).unwrap();
    assert_eq!(store.read_inventory(SITE, "b1").unwrap(), None);
    assert!(!site_dir(tmp.path())
        .join("batches/b1.inventory.age")
        .exists());
    assert_eq!(store.ready(&[SITE.to_string()], false).len(), 1);
}

#[test]
fn an_inventory_that_cannot_be_removed_stops_the_batch_seal() {
    let (tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    put(&store, id, 0, b"part").unwrap();
    seal_one(&store, id, "b1", b"part");
    let inventory = site_dir(tmp.path()).join("batches/b1.inventory.age");
    std::fs::create_dir_all(&inventory).unwrap();
    let message = io_message(store.seal_batch(SITE, "b1", &[id], None));
    assert_eq!(
        message,
        format!(
            "batch b1: {}: Is a directory (os error 21)",
            inventory.display()
        )
    );
    // The batch is not sealed: the core is never offered it with a stale inventory.
    assert!(!site_dir(tmp.path()).join("batches/b1.json").exists());
    assert!(store.ready(&[SITE.to_string()], false).is_empty());
}

#[test]
fn an_inventory_that_cannot_be_read_is_an_error_naming_it() {
    let (tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    put(&store, id, 0, b"part").unwrap();
    seal_one(&store, id, "b1", b"part");
    store
        .seal_batch(SITE, "b1", &[id], Some(b"sealed inventory"))
        .unwrap();
    let inventory = site_dir(tmp.path()).join("batches/b1.inventory.age");
    std::fs::remove_file(&inventory).unwrap();
    std::fs::create_dir(&inventory).unwrap();
    // Not "sealed without an inventory": the inventory is there and unreadable.
    let message = io_message(store.read_inventory(SITE, "b1"));
    assert_eq!(
        message,
        format!(
            "inventory: {}: Is a directory (os error 21)",
            inventory.display()
        )
    );
}

#[test]
fn a_missing_part_is_not_found_and_an_unreadable_one_an_io_error() {
    let (tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    put(&store, id, 0, b"part").unwrap();
    match read_part(&store, id, 3) {
        Err(StoreError::NotFound(m)) => {
            assert_eq!(m, format!("part 3 of object {id} is not at the relay"));
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    let unreadable = part_path(tmp.path(), id, 3);
    std::fs::create_dir(&unreadable).unwrap();
    let message = io_message(read_part(&store, id, 3));
    assert_eq!(
        message,
        format!("part: {}: is a directory", unreadable.display())
    );
}

#[test]
fn cancelling_an_object_whose_part_never_arrived_removes_its_record() {
    let (tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    put(&store, id, 0, b"part").unwrap();
    // The record is written before the part: a failed part write leaves the record alone.
    let objects = site_dir(tmp.path()).join("objects").join(id.to_string());
    std::fs::remove_dir_all(&objects).unwrap();
    let meta = site_dir(tmp.path()).join("meta").join(id.to_string());
    assert!(meta.exists());
    // An open batch: no batch record or inventory to remove, which is fine.
    assert_eq!(store.cancel(SITE, "b1", &[id]).unwrap(), (1, 0));
    assert!(!meta.exists());
    assert!(store.holdings().unwrap().is_empty());
}

#[test]
fn cancel_reports_a_batch_record_it_cannot_remove() {
    let (tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    put(&store, id, 0, b"part").unwrap();
    let record = site_dir(tmp.path()).join("batches/b1.json");
    std::fs::create_dir_all(&record).unwrap();
    let message = io_message(store.cancel(SITE, "b1", &[id]));
    assert_eq!(
        message,
        format!(
            "cancellation of batch b1: {}: Is a directory (os error 21)",
            record.display()
        )
    );
    assert_eq!(read_part(&store, id, 0).unwrap(), b"part");
}

#[test]
fn cancel_reports_an_object_it_cannot_remove() {
    let (tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    put(&store, id, 0, b"part").unwrap();
    // A file where the object's directory should be: removing it as a directory fails.
    let objects = site_dir(tmp.path()).join("objects").join(id.to_string());
    std::fs::remove_dir_all(&objects).unwrap();
    std::fs::write(&objects, b"not a directory").unwrap();
    let message = io_message(store.cancel(SITE, "b1", &[id]));
    assert_eq!(
        message,
        format!(
            "cancellation of batch b1: {}: Not a directory (os error 20)",
            objects.display()
        )
    );
    assert!(site_dir(tmp.path())
        .join("meta")
        .join(id.to_string())
        .exists());
}

#[test]
fn holdings_count_each_batchs_objects_and_bytes() {
    let (_tmp, store) = fresh_store(None);
    let (x, y, open) = (ObjectId::random(), ObjectId::random(), ObjectId::random());
    put(&store, x, 0, &[1u8; 10]).unwrap();
    seal_one(&store, x, "b1", &[1u8; 10]);
    put(&store, y, 0, &[2u8; 20]).unwrap();
    seal_one(&store, y, "b1", &[2u8; 20]);
    store.seal_batch(SITE, "b1", &[x, y], None).unwrap();
    put(&store, open, 0, &[3u8; 5]).unwrap();

    let holdings = store.holdings().unwrap();
    let summary: Vec<_> = holdings
        .iter()
        .map(|h| {
            (
                h.site.as_str(),
                h.batch.as_deref(),
                h.batch_sealed,
                h.objects,
                h.bytes,
            )
        })
        .collect();
    // Each sealed object: its part and a one-byte manifest.
    assert_eq!(
        summary,
        vec![
            (SITE, None, false, 1, 5),
            (SITE, Some("b1"), true, 2, 10 + 1 + 20 + 1),
        ]
    );
    assert!(holdings.iter().all(|h| h.oldest <= h.newest));
}

#[test]
fn expired_uploads_report_the_objects_and_bytes_they_freed() {
    let (tmp, store) = fresh_store(None);
    let (old, older) = (ObjectId::random(), ObjectId::random());
    put(&store, old, 0, &[1u8; 7]).unwrap();
    put(&store, older, 0, &[2u8; 11]).unwrap();
    put(&store, older, 1, &[3u8; 13]).unwrap();
    let ten_days_ago = SystemTime::now() - Duration::from_secs(10 * 86_400);
    for id in [old, older] {
        date_records(tmp.path(), id, ten_days_ago);
    }
    assert_eq!(
        store.expire_open(Duration::from_secs(7 * 86_400)).unwrap(),
        (2, 7 + 11 + 13)
    );
    assert!(store.holdings().unwrap().is_empty());
}

#[test]
fn an_upload_changed_exactly_at_the_cutoff_does_not_expire() {
    let (tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    put(&store, id, 0, &[1u8; 7]).unwrap();
    // Dated at the epoch, with an age limit longer than the epoch's age: the cutoff is the
    // epoch itself (it cannot go lower), exactly when the object last changed. Only what
    // changed strictly before the cutoff expires.
    date_records(tmp.path(), id, SystemTime::UNIX_EPOCH);
    assert_eq!(store.expire_open(Duration::MAX).unwrap(), (0, 0));
    assert_eq!(read_part(&store, id, 0).unwrap(), vec![1u8; 7]);
    // With no age limit at all it is strictly older than the cutoff (now), and expires.
    assert_eq!(store.expire_open(Duration::ZERO).unwrap(), (1, 7));
}

#[test]
fn rejecting_a_part_gives_its_bytes_back_to_the_quota() {
    let (_tmp, store) = fresh_store(Some(1000));
    let id = ObjectId::random();
    let body = [5u8; 999];
    put(&store, id, 0, &body).unwrap();
    seal_one(&store, id, "b1", &body);
    store.reject(SITE, id, 0).unwrap();
    assert_eq!(store.status(SITE, id).unwrap().state, ObjectState::Open);
    // The manifest's byte is still held: the part fits again exactly, one byte more does not.
    assert_eq!(put(&store, id, 0, &body).unwrap(), Stored::New);
    let message = no_room_message(put(&store, id, 1, &[6u8; 1]));
    assert!(message.contains("(1000 of 1000 bytes held)"), "{message}");
}

#[test]
fn rejecting_a_part_already_gone_succeeds() {
    let (_tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    put(&store, id, 0, b"part").unwrap();
    store.reject(SITE, id, 0).unwrap();
    // The core's report arrives twice (its first answer was lost): nothing left to remove.
    store.reject(SITE, id, 0).unwrap();
    let status = store.status(SITE, id).unwrap();
    assert_eq!((status.state, status.parts), (ObjectState::Open, vec![]));
}

#[test]
fn reject_reports_a_file_it_cannot_remove() {
    let (tmp, store) = fresh_store(None);
    let id = ObjectId::random();
    put(&store, id, 0, b"part").unwrap();
    let held = part_path(tmp.path(), id, 0);
    std::fs::remove_file(&held).unwrap();
    std::fs::create_dir(&held).unwrap();
    let message = io_message(store.reject(SITE, id, 0));
    assert_eq!(
        message,
        format!(
            "rejected part: {}: Is a directory (os error 21)",
            held.display()
        )
    );
}

/// Two relays on one bucket hold a site to one quota: each counts again from the bucket what
/// the other stored (a figure at most two seconds old), so the second cannot take another
/// quota's worth; once the first's bytes are gone, it can.
#[test]
fn relays_sharing_a_bucket_share_its_quota() {
    use forte_bucket::test_server::S3Server;
    use forte_relay::server::store::Location;
    let tmp = tempfile::tempdir().unwrap();
    let Some(s3) = S3Server::start(tmp.path(), &["relay"]) else {
        return;
    };
    let bucket = || Location::Bucket {
        url: "s3://relay/store".into(),
        credentials: s3.credentials(),
    };
    let (a, b) = (
        Store::open(bucket(), Some(1000)).unwrap(),
        Store::open(bucket(), Some(1000)).unwrap(),
    );
    let first = ObjectId::random();
    assert_eq!(put(&a, first, 0, &[1u8; 800]).unwrap(), Stored::New);
    std::thread::sleep(Duration::from_millis(2100));
    let m = no_room_message(put(&b, ObjectId::random(), 0, &[2u8; 800]));
    assert!(
        m.contains("800 bytes do not fit in site site-a's quota: 800 of 1000 bytes held, 200 free"),
        "{m}"
    );
    a.cancel(SITE, "never-sealed", &[first]).unwrap();
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(
        put(&b, ObjectId::random(), 0, &[2u8; 800]).unwrap(),
        Stored::New
    );
}

/// Two senders on one object: one seals it with part A while the other writes part B over A.
/// Whatever the interleaving, a sealed object's part is the one its seal lists: the seal checks
/// the parts and writes its record with no part written in between.
#[test]
fn a_seal_and_a_part_written_at_once_never_leave_the_part_unlike_the_seal() {
    let (tmp, store) = fresh_store(None);
    let (a, b) = (vec![1u8; 3000], vec![2u8; 3000]);
    let mut sealed_unlike = 0;
    for _ in 0..200 {
        let id = ObjectId::random();
        put(&store, id, 0, &a).unwrap();
        let parts = vec![part(0, &a)];
        std::thread::scope(|s| {
            s.spawn(|| {
                let _ = put(&store, id, 0, &b);
            });
            let _ = store.seal(SITE, id, "batch", &parts, b"m");
        });
        let sealed = matches!(store.status(SITE, id).unwrap().state, ObjectState::Complete);
        let held = std::fs::read(part_path(tmp.path(), id, 0)).unwrap();
        if sealed && held != a {
            sealed_unlike += 1;
        }
    }
    assert_eq!(
        sealed_unlike, 0,
        "objects sealed with a part unlike their seal"
    );
}
