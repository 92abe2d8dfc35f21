//! Network faults between the edge and the relay, injected by a TCP proxy on real
//! connections: resets in the middle of parts, a link collapsing to a few kB/s, a relay that
//! is unreachable for a while. The watching sender recovers by itself and everything arrives
//! identical, with the failed attempts in the catalogue.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::proxy::{Fault, FaultProxy};
use crate::common::site::*;
use crate::common::*;

/// `args` with the relay's URL replaced by the proxy's, so that role talks through it.
fn via(proxy: &FaultProxy, site: &Site, args: Args) -> Args {
    let proxied = format!("https://{}", proxy.addr);
    args.into_iter()
        .map(|a| {
            if a == *site.relay.url {
                proxied.clone().into()
            } else {
                a
            }
        })
        .collect()
}

#[test]
fn a_sender_survives_resets_a_collapsed_link_and_an_outage() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    let mut expected = BTreeMap::new();
    for b in 0..3 {
        let name = format!("run-{b}");
        for f in 0..3 {
            let rel = format!("bags/{f}.bag");
            // Incompressible: the bytes on the wire are the bytes of the files.
            write(&inbox.join(&name).join(&rel), &random_bytes(2_500_000));
        }
        write(&inbox.join(&name).join(".ready"), b"");
        for (p, h) in source_hashes(&inbox.join(&name)) {
            expected.insert(format!("site-a/{name}/{p}"), h);
        }
    }
    let relay_addr = site.relay.url.trim_start_matches("https://").to_string();
    let proxy = FaultProxy::start(&relay_addr);
    let send = via(
        &proxy,
        &site,
        site.send(&["--watch", "--interval", "1", "--part-size", "1MiB"]),
    );
    let send_log = site.root.join("send.log");
    let _send = spawn_logged(&send, &send_log);
    let log = || std::fs::read_to_string(&send_log).unwrap_or_default();
    let mut pull = site.pull();
    pull.extend(args!["--watch", "--interval", "1"]);
    let _pull = spawn_logged(&pull, &site.root.join("pull.log"));

    let sent = || proxy.forwarded.load(Ordering::Relaxed);
    // 1. Every connection reset while parts are in flight.
    assert!(wait_for(60, || sent() > 3_000_000), "uploads did not start");
    proxy.reset_all();
    // 2. The link collapses to 20 kB/s for three seconds.
    assert!(
        wait_for(60, || sent() > 9_000_000),
        "uploads did not resume after the resets ({} bytes): {}",
        sent(),
        log()
    );
    proxy.set(Fault::Throttle(20_000));
    std::thread::sleep(Duration::from_secs(3));
    proxy.set(Fault::None);
    // 3. The relay is unreachable for six seconds (open connections reset, new ones refused).
    assert!(
        wait_for(60, || sent() > 15_000_000),
        "uploads did not resume after the collapse"
    );
    proxy.set(Fault::Down);
    std::thread::sleep(Duration::from_secs(6));
    proxy.set(Fault::None);

    let dest = site.root.join("dest");
    assert!(
        wait_for(120, || visible(&dest) == expected),
        "not everything arrived identical: {} of {} files",
        visible(&dest).len(),
        expected.len()
    );
    let status = site.status(&site.edge_catalog, &[]);
    assert!(status.contains("recent failures:"), "{status}");
    assert!(
        wait_for(30, || site.relay_objects().is_empty()),
        "all acknowledged"
    );
}

#[test]
fn a_puller_survives_a_stall_longer_than_its_timeout_resets_and_an_outage() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    let mut expected = BTreeMap::new();
    for b in 0..2 {
        let name = format!("core-{b}");
        for f in 0..3 {
            write(
                &inbox.join(&name).join(format!("{f}.bin")),
                &random_bytes(2_000_000),
            );
        }
        write(&inbox.join(&name).join(".ready"), b"");
        for (p, h) in source_hashes(&inbox.join(&name)) {
            expected.insert(format!("site-a/{name}/{p}"), h);
        }
    }
    // Everything reaches the relay first; then the core pulls through the proxy.
    ok(&site.send(&["--part-size", "512KiB", "-q"]));
    let relay_addr = site.relay.url.trim_start_matches("https://").to_string();
    let proxy = FaultProxy::start(&relay_addr);
    let mut pull = via(&proxy, &site, site.pull());
    pull.extend(args![
        "--watch",
        "--interval",
        "1",
        "--timeout",
        "3",
        "--connections",
        "2"
    ]);
    // The core's requests are small; its downloads are what crosses the proxy back.
    proxy.set(Fault::Throttle(300_000));
    let pull_log = site.root.join("pull.log");
    let _pull = spawn_logged(&pull, &pull_log);
    let log = || std::fs::read_to_string(&pull_log).unwrap_or_default();
    std::thread::sleep(Duration::from_secs(2));
    // 1. A stall of 6 s, twice the request timeout: requests are abandoned and retried.
    proxy.set(Fault::Stall);
    std::thread::sleep(Duration::from_secs(6));
    proxy.set(Fault::Throttle(300_000));
    std::thread::sleep(Duration::from_secs(2));
    // 2. Every connection reset, then the relay unreachable for 4 s.
    proxy.reset_all();
    proxy.set(Fault::Down);
    std::thread::sleep(Duration::from_secs(4));
    proxy.set(Fault::None);

    let dest = site.root.join("dest");
    assert!(
        wait_for(120, || visible(&dest) == expected),
        "not everything arrived identical: {} of {} files\n{}",
        visible(&dest).len(),
        expected.len(),
        log()
    );
    assert!(
        log().contains("retrying"),
        "the faults were noticed and retried: {}",
        log()
    );
    assert!(
        wait_for(30, || site.relay_objects().is_empty()),
        "all acknowledged"
    );
    let status = site.status(&site.core_catalog, &[]);
    assert!(status.contains("recent failures:"), "{status}");
}

#[test]
fn a_batch_is_sealed_beside_its_last_upload_not_a_round_trip_after_it() {
    let mut site = Site::new();
    let log = site.root.join("relay.log");
    site.relay = start_relay_logging_to(&site.root, &log);
    let batch = site.root.join("inbox/run-1");
    write(&batch.join("big.bin"), &random_bytes(1_500_000));
    write(&batch.join("notes.txt"), b"a small file");
    write(&batch.join(".ready"), b"");
    let relay_addr = site.relay.url.trim_start_matches("https://").to_string();
    let proxy = FaultProxy::start(&relay_addr);
    // The large file takes about three seconds to cross.
    proxy.set(Fault::Throttle(500_000));
    let out = ok(&via(&proxy, &site, site.send(&[])));
    assert!(out.contains("sent 2 of 2 files"), "{out}");
    let log = std::fs::read_to_string(&log).unwrap();
    // The seal went as soon as the last object set off, and the relay waited for it.
    let waited = log.find("batch seal waits for objects on the way");
    let sealed = log.find("batch sealed");
    assert!(
        matches!((waited, sealed), (Some(w), Some(s)) if w < s),
        "{log}"
    );
    ok(&site.pull());
    let delivered = source_hashes(&site.root.join("dest/site-a/run-1"));
    assert_eq!(delivered, source_hashes(&batch));
}
