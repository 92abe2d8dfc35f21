//! Resources running out under the daemons: the relay's disk, the core's destination, the
//! catalogue's server. Each is real (a size-limited tmpfs, a PostgreSQL server stopped and
//! started); the daemons wait, lose nothing, and carry on when the resource returns.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::common::machine::{PrivatePostgres, Tmpfs};
use crate::common::site::*;
use crate::common::*;

const MIB: u64 = 1 << 20;

/// Writes `batches` ready batches of `files` random files of `size` bytes into `inbox`;
/// returns where each file must arrive (default layout) with its SHA-256.
fn batches(inbox: &Path, names: &[&str], files: usize, size: u64) -> BTreeMap<String, String> {
    let mut expected = BTreeMap::new();
    for name in names {
        for f in 0..files {
            write(
                &inbox.join(name).join(format!("{f}.bin")),
                &random_bytes(size),
            );
        }
        write(&inbox.join(name).join(".ready"), b"");
        for (p, h) in source_hashes(&inbox.join(name)) {
            expected.insert(format!("site-a/{name}/{p}"), h);
        }
    }
    expected
}

fn watching(mut args: Args) -> Args {
    args.extend(args!["--watch", "--interval", "1"]);
    args
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

#[test]
fn a_full_relay_disk_makes_the_sender_wait_and_nothing_is_lost() {
    let mut site = Site::new();
    let _ = site.relay.child.kill();
    let _ = site.relay.child.wait();
    let Some(disk) = Tmpfs::mount(&site.relay.store, 32 * MIB) else {
        return;
    };
    site.restart_relay();
    let ballast = disk.fill_leaving(3 * MIB);
    let expected = batches(
        &site.root.join("inbox"),
        &["full-0", "full-1"],
        3,
        1_500_000,
    );

    let send_log = site.root.join("send.log");
    let _send = spawn_logged(&watching(site.send(&["--part-size", "512KiB"])), &send_log);
    assert!(
        wait_for(60, || read(&send_log).contains("relay disk full")),
        "the sender never met the full disk: {}",
        read(&send_log)
    );
    // While full: what the relay refused left no partial part behind.
    std::thread::sleep(Duration::from_secs(2));
    let tmp = site.relay.store.join("sites/site-a/tmp");
    let leftovers: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert!(
        leftovers.is_empty(),
        "temporary files left in the relay: {leftovers:?}"
    );
    let status = site.status(&site.edge_catalog, &[]);
    assert!(status.contains("disk full"), "{status}");

    // Space returns; the sender resumes by itself and the core gets everything.
    std::fs::remove_file(ballast).unwrap();
    let _pull = spawn_logged(&watching(site.pull()), &site.root.join("pull.log"));
    let dest = site.root.join("dest");
    assert!(
        wait_for(120, || visible(&dest) == expected),
        "not everything arrived identical after space returned: {} of {} files\n{}",
        visible(&dest).len(),
        expected.len(),
        read(&send_log)
    );
    assert!(
        wait_for(30, || site.relay_objects().is_empty()),
        "all acknowledged"
    );
}

#[test]
fn a_full_destination_makes_the_puller_wait_and_nothing_is_lost() {
    let site = Site::new();
    let dest = site.root.join("dest");
    let Some(disk) = Tmpfs::mount(&dest, 24 * MIB) else {
        return;
    };
    let expected = batches(
        &site.root.join("inbox"),
        &["dest-0", "dest-1"],
        3,
        1_500_000,
    );
    ok(&site.send(&["--part-size", "512KiB", "-q"]));
    let at_relay = site.relay_objects();
    let ballast = disk.fill_leaving(2 * MIB);

    let pull_log = site.root.join("pull.log");
    let _pull = spawn_logged(&watching(site.pull()), &pull_log);
    assert!(
        wait_for(60, || read(&pull_log).contains("No space left on device")),
        "the puller never met the full destination: {}",
        read(&pull_log)
    );
    std::thread::sleep(Duration::from_secs(2));
    // While full: nothing delivered, nothing acknowledged, so the relay still holds it all.
    let delivered: Vec<_> = visible(&dest)
        .into_keys()
        .filter(|p| p != "ballast")
        .collect();
    assert!(delivered.is_empty(), "visible while full: {delivered:?}");
    assert_eq!(
        site.relay_objects(),
        at_relay,
        "the relay deleted something"
    );

    std::fs::remove_file(ballast).unwrap();
    assert!(
        wait_for(120, || visible(&dest) == expected),
        "not everything arrived identical after space returned: {} of {} files\n{}",
        visible(&dest).len(),
        expected.len(),
        read(&pull_log)
    );
    assert!(
        wait_for(30, || site.relay_objects().is_empty()),
        "all acknowledged"
    );
    let staging: Vec<_> = std::fs::read_dir(&dest)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".forte-staging-")
        })
        .collect();
    assert!(staging.is_empty(), "staging left behind: {staging:?}");
}

#[test]
fn the_daemons_wait_out_a_postgresql_restart_and_the_catalogue_misses_nothing() {
    let Some(server) = PrivatePostgres::start() else {
        return;
    };
    let mut site = Site::new();
    site.edge_catalog = server.url();
    site.core_catalog = server.url();
    let inbox = site.root.join("inbox");
    let mut expected = batches(&inbox, &["pg-0", "pg-1"], 3, 1_000_000);
    let (send_log, pull_log) = (site.root.join("send.log"), site.root.join("pull.log"));
    let _send = spawn_logged(&watching(site.send(&["--settle", "1"])), &send_log);
    let _pull = spawn_logged(&watching(site.pull()), &pull_log);
    let dest = site.root.join("dest");
    assert!(
        wait_for(60, || visible(&dest) == expected),
        "the first batches did not arrive\nsend: {}\npull: {}",
        read(&send_log),
        read(&pull_log)
    );

    // The server goes away while new batches arrive, and comes back eight seconds later.
    server.stop();
    expected.extend(batches(&inbox, &["pg-2", "pg-3"], 3, 1_000_000));
    std::thread::sleep(Duration::from_secs(8));
    server.start_again();
    expected.extend(batches(&inbox, &["pg-4"], 3, 1_000_000));

    assert!(
        wait_for(120, || visible(&dest) == expected),
        "not everything arrived identical across the restart: {} of {} files\nsend: {}\npull: {}",
        visible(&dest).len(),
        expected.len(),
        read(&send_log),
        read(&pull_log)
    );
    assert!(
        read(&send_log).contains("unavailable") || read(&pull_log).contains("unavailable"),
        "neither daemon noticed the outage\nsend: {}\npull: {}",
        read(&send_log),
        read(&pull_log)
    );
    // Every file's history is complete: discovered at the edge, acknowledged at the core.
    let count = |state: &str| -> usize {
        let out = stdout_of(tool("psql").arg(server.url()).args([
            "-qAtc",
            &format!("SELECT count(DISTINCT object_id) FROM events WHERE state = '{state}'"),
        ]));
        String::from_utf8(out).unwrap().trim().parse().unwrap()
    };
    assert!(
        wait_for(60, || count("acknowledged") == expected.len()),
        "acknowledged in the catalogue: {} of {}",
        count("acknowledged"),
        expected.len()
    );
    assert_eq!(count("discovered"), expected.len());
    assert_eq!(count("delivered"), expected.len());
}
