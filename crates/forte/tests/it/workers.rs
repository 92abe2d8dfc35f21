//! Several core workers (`pull --watch`) sharing one relay, one destination and one PostgreSQL
//! catalogue: each batch is delivered by exactly one of them under a lease, through kills and
//! stalls.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::site::*;
use crate::common::*;
use forte_bucket::test_server::{S3Server, SECRET};
use forte_format::seal::sha256_hex;

/// Writes a ready batch of `files` files of `size` bytes under `inbox`, and adds each, by its
/// delivered path (under `site`), to `expected`.
fn batch_of(
    site: &str,
    inbox: &Path,
    name: &str,
    (files, size): (usize, usize),
    expected: &mut BTreeMap<String, String>,
) {
    let dir = inbox.join(name);
    for i in 0..files {
        // Incompressible, so that a limited upload takes as long as its size says.
        let bytes = random_bytes((size + i * 977) as u64);
        write(&dir.join(format!("data/{i:03}.bin")), &bytes);
        expected.insert(format!("{site}/{name}/data/{i:03}.bin"), sha256_hex(&bytes));
    }
    write(&dir.join(".ready"), b"");
}

/// [`batch_of`] site-a.
fn batch(
    inbox: &Path,
    name: &str,
    files: usize,
    size: usize,
    expected: &mut BTreeMap<String, String>,
) {
    batch_of("site-a", inbox, name, (files, size), expected);
}

/// Rows of `sql` on the catalogue at `url`, one string per row (`|` between columns).
fn query(url: &str, sql: &str) -> Vec<String> {
    let out = stdout_of(tool("psql").arg(url).args(["-qAtc", sql]));
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Files written into place more than once, by the lineage: object ids with more than one
/// `delivered` event that did not find the file already in place.
fn written_twice(url: &str) -> Vec<String> {
    query(
        url,
        "SELECT object_id, count(*) FROM events WHERE state = 'delivered'
         AND detail NOT LIKE 'already in place%' GROUP BY object_id HAVING count(*) > 1",
    )
}

/// The worker named in each delivered file's lineage, by object id.
fn delivered_by(url: &str) -> BTreeMap<String, String> {
    query(
        url,
        "SELECT object_id, detail FROM events WHERE state = 'delivered' ORDER BY at",
    )
    .into_iter()
    .filter_map(|row| {
        let (id, detail) = row.split_once('|')?;
        let worker = detail.split("by worker ").nth(1)?.split(' ').next()?;
        Some((id.to_string(), worker.to_string()))
    })
    .collect()
}

/// Asserts by the catalogue at `url` that no file was written twice and that each of
/// `expected` has one delivery, by one of `workers`; returns the worker of each.
fn assert_delivered_once_by(
    url: &str,
    expected: &BTreeMap<String, String>,
    workers: &[&str],
) -> BTreeMap<String, String> {
    assert_eq!(written_twice(url), Vec::<String>::new(), "written twice");
    let by = delivered_by(url);
    assert_eq!(
        by.len(),
        expected.len(),
        "a delivered event per file: {by:?}"
    );
    assert!(
        by.values().all(|w| workers.contains(&w.as_str())),
        "each lineage names its worker: {by:?}"
    );
    by
}

fn pull_worker(site: &Site, name: &str, lease: &str) -> Args {
    let mut pull = site.pull();
    pull.extend(args![
        "--watch",
        "--interval",
        "1",
        "--worker",
        name,
        "--lease",
        lease
    ]);
    pull
}

fn signal(daemon: &Daemon, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &daemon.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name}");
}

/// Three workers on one PostgreSQL catalogue while batches arrive, one of them killed with
/// SIGKILL and restarted every second or two: every file arrives once and identical, the relay
/// ends empty, and each file's lineage names the worker that delivered it.
#[test]
fn workers_sharing_a_catalogue_deliver_each_batch_once_through_kills() {
    let Some(site) = Site::with_postgres() else {
        return;
    };
    let inbox = site.root.join("inbox");
    std::fs::create_dir_all(&inbox).unwrap();
    let mut expected = BTreeMap::new();
    let _sender = spawn_logged(
        &site.send(&["--watch", "--interval", "1", "--part-size", "1MiB"]),
        &site.root.join("send.log"),
    );
    let names = ["core-1", "core-2", "core-3"];
    let log = |n: &str| site.root.join(format!("{n}.log"));
    let mut workers: Vec<Daemon> = names
        .iter()
        .map(|n| spawn_logged(&pull_worker(&site, n, "3s"), &log(n)))
        .collect();
    for round in 0..8 {
        batch(&inbox, &format!("run-{round}"), 3, 700_000, &mut expected);
        let victim = (round * 2 + round / 3) % names.len();
        std::thread::sleep(Duration::from_millis(300 + (round as u64 * 331) % 1200));
        kill(&mut workers[victim]);
        // Whatever is visible is a sent file, identical.
        for (path, hash) in visible(&site.root.join("dest")) {
            assert_eq!(
                expected.get(&path),
                Some(&hash),
                "{path} is not a sent file"
            );
        }
        workers[victim] = spawn_logged(
            &pull_worker(&site, names[victim], "3s"),
            &log(names[victim]),
        );
    }
    let logs = || {
        names
            .iter()
            .map(|n| {
                format!(
                    "\n{n}: {}",
                    std::fs::read_to_string(log(n)).unwrap_or_default()
                )
            })
            .collect::<String>()
    };
    let dest = site.root.join("dest");
    assert_all_arrive(&dest, &expected, logs);
    assert!(
        wait_for(30, || site.relay_objects().is_empty()),
        "the relay still holds {:?}",
        site.relay_objects()
    );
    let by = assert_delivered_once_by(&site.core_catalog, &expected, &names);
    let workers_used: std::collections::BTreeSet<_> = by.values().collect();
    assert!(workers_used.len() > 1, "one worker did everything: {by:?}");
}

/// A worker stopped (SIGSTOP) while it holds a batch, past its lease: another worker takes the
/// batch over; the stopped one, continued while the batch is still being sent, learns it lost
/// the batch and leaves it: nothing is written twice, recorded twice or acknowledged twice.
#[test]
fn a_stalled_worker_neither_delivers_nor_acknowledges_a_second_time() {
    let Some(site) = Site::with_postgres() else {
        return;
    };
    let inbox = site.root.join("inbox");
    let mut expected = BTreeMap::new();
    batch(&inbox, "slow", 6, 1_500_000, &mut expected);
    let dest = site.root.join("dest");
    let (log_a, log_b) = (site.root.join("a.log"), site.root.join("b.log"));
    let a = spawn_logged(&pull_worker(&site, "core-a", "2s"), &log_a);
    // Slow enough that core-a holds the batch, fetching it ahead, for seconds; one upload at a
    // time, so that its first objects are sealed early (five sharing the limit sealed the
    // first after 7 of the 9 s, and core-b could take over only after the last).
    let _sender = spawn_logged(
        &site.send(&[
            "--watch",
            "--interval",
            "1",
            "--part-size",
            "1MiB",
            "--bwlimit",
            "1MB",
            "--connections",
            "1",
        ]),
        &site.root.join("send.log"),
    );
    assert!(
        wait_for(60, || !staging_dirs(&dest).is_empty()),
        "core-a never fetched ahead: {}",
        std::fs::read_to_string(&log_a).unwrap_or_default()
    );
    signal(&a, "STOP");
    let _b = spawn_logged(&pull_worker(&site, "core-b", "2s"), &log_b);
    let logs = || {
        let read = |p| std::fs::read_to_string(p).unwrap_or_default();
        format!("\ncore-a: {}\ncore-b: {}", read(&log_a), read(&log_b))
    };
    let url = &site.core_catalog;
    let holders = || query(url, "SELECT worker FROM batch_claims");
    assert!(
        wait_for(30, || holders() == ["core-b"]),
        "core-b did not take the batch over: {:?}{}",
        holders(),
        logs()
    );
    // Continued while the edge still sends: without the lease it would go on fetching ahead
    // and deliver the batch too.
    signal(&a, "CONT");
    assert!(
        !site.relay_objects().is_empty(),
        "the batch was delivered before core-a was continued: the test proves nothing"
    );
    assert!(
        wait_for(90, || visible(&dest) == expected
            && site.relay_objects().is_empty()),
        "not delivered: {} of {} files{}",
        visible(&dest).len(),
        expected.len(),
        logs()
    );
    assert!(
        wait_for(20, || std::fs::read_to_string(&log_a)
            .unwrap_or_default()
            .contains("left to it")),
        "core-a did not learn it lost the batch{}",
        logs()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(visible(&dest), expected);
    assert_eq!(
        written_twice(url),
        Vec::<String>::new(),
        "written twice{}",
        logs()
    );
    let by = delivered_by(url);
    assert_eq!(by.len(), expected.len(), "{by:?}");
    assert!(by.values().all(|w| w == "core-b"), "{by:?}{}", logs());
    let acknowledged = query(
        url,
        "SELECT object_id, count(*) FROM events WHERE state = 'acknowledged' GROUP BY object_id",
    );
    assert_eq!(acknowledged.len(), expected.len(), "{acknowledged:?}");
    assert!(
        acknowledged.iter().all(|row| row.ends_with("|1")),
        "acknowledged twice: {acknowledged:?}{}",
        logs()
    );
}

/// `args` with the relay at `relay` in place of the site's own.
fn via(mut args: Args, relay: &Relay) -> Args {
    for (flag, value) in [
        ("--relay", &relay.url),
        ("--relay-fingerprint", &relay.fingerprint),
    ] {
        let at = args.iter().position(|a| a == flag).expect("a relay flag") + 1;
        args[at] = value.into();
    }
    args
}

/// Files in the bucket other than tombstones (`sites/*/acked/*`, what tells an edge its objects
/// were delivered), the relays' shared certificate and the S3 server's own temporary files.
fn left_in_bucket(tree: &Path) -> Vec<String> {
    visible(tree)
        .into_keys()
        .filter(|k| {
            !(k.starts_with(".sgwtmp")
                || k == "tls/identity.pem"
                || k.contains("/acked/")
                || k.contains("/receipts/"))
        })
        .collect()
}

/// The scale-out run, shortened for CI (`FORTE_TEST_SCALE_SECONDS`, default 40; the
/// acceptance run is 600): two relay processes over one S3 bucket, three core workers on one
/// PostgreSQL catalogue, two sites sending, while a worker or a relay is killed (SIGKILL) and
/// restarted every second or two. Every file arrives once and identical, the bucket is left with
/// nothing but tombstones and the core's receipts for the edges, and each file's lineage names the worker that delivered it.
#[test]
fn two_relays_on_one_bucket_and_three_workers_deliver_everything_once_through_kills() {
    let Some(site) = Site::with_postgres() else {
        return;
    };
    let Some(s3) = S3Server::start(&site.root.join("s3"), &["relay"]) else {
        return;
    };
    let seconds: u64 = std::env::var("FORTE_TEST_SCALE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let env = s3.env(SECRET);
    let tree = site.root.join("s3/relay");
    let relay_log = |i: usize| site.root.join(format!("relay-{i}.log"));
    let start_relay = |i: usize, listen: &str| {
        start_bucket_relay(&site.root, listen, "s3://relay", &tree, &env, &relay_log(i))
    };
    let mut relays = vec![start_relay(0, "127.0.0.1:0")];
    relays.push(start_relay(1, "127.0.0.1:0"));
    assert_eq!(
        relays[0].fingerprint, relays[1].fingerprint,
        "relays on one bucket present one certificate"
    );

    let keys_b = keygen(&site.root.join("keys-b"));
    let (inbox_a, inbox_b) = (site.root.join("inbox"), site.root.join("inbox-b"));
    for inbox in [&inbox_a, &inbox_b] {
        std::fs::create_dir_all(inbox).unwrap();
    }
    let watch = ["--watch", "--interval", "1", "--part-size", "1MiB"];
    let _senders = [
        spawn_logged(
            &via(site.send(&watch), &relays[0]),
            &site.root.join("send-a.log"),
        ),
        spawn_logged(
            &via(site.send_as_site_b(&keys_b, &watch), &relays[1]),
            &site.root.join("send-b.log"),
        ),
    ];
    let names = ["core-1", "core-2", "core-3"];
    let log = |n: &str| site.root.join(format!("{n}.log"));
    // A restarted relay listens where it did: each worker keeps its relay's address.
    let pulls: Vec<Args> = (0..names.len())
        .map(|i| {
            let mut pull = via(pull_worker(&site, names[i], "3s"), &relays[i % 2]);
            pull.extend(args![
                "--trust",
                format!("site-b={}", keys_b.edge_pub.display())
            ]);
            pull
        })
        .collect();
    let worker = |i: usize| spawn_logged(&pulls[i], &log(names[i]));
    let mut workers: Vec<Daemon> = (0..names.len()).map(worker).collect();

    let mut expected = BTreeMap::new();
    // A fixed sequence of victims and pauses, different every round (no randomness to chase).
    let started = Instant::now();
    let mut round = 0usize;
    while started.elapsed() < Duration::from_secs(seconds) {
        let (site_name, inbox) = [("site-a", &inbox_a), ("site-b", &inbox_b)][round % 2];
        batch_of(
            site_name,
            inbox,
            &format!("run-{round}"),
            (2, 300_000),
            &mut expected,
        );
        std::thread::sleep(Duration::from_millis(700 + (round as u64 * 397) % 1300));
        match (round * 7 + round / 5) % 5 {
            victim @ 0..=2 => {
                kill(&mut workers[victim]);
                workers[victim] = worker(victim);
            }
            r => {
                let i = r - 3;
                let listen = relays[i].listen.clone();
                let _ = relays[i].child.kill();
                let _ = relays[i].child.wait();
                relays[i] = start_relay(i, &listen);
            }
        }
        // Whatever is visible is a sent file, identical.
        for (path, hash) in visible(&site.root.join("dest")) {
            assert_eq!(
                expected.get(&path),
                Some(&hash),
                "{path} is not a sent file"
            );
        }
        round += 1;
    }
    let logs = || {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        let mut all: String = names
            .iter()
            .map(|n| format!("\n{n}: {}", read(&log(n))))
            .collect();
        for i in 0..2 {
            all += &format!("\nrelay {i}: {}", read(&relay_log(i)));
        }
        all
    };
    assert_all_arrive(&site.root.join("dest"), &expected, logs);
    assert!(
        wait_for(60, || left_in_bucket(&tree).is_empty()),
        "the bucket still holds {:?}{}",
        left_in_bucket(&tree),
        logs()
    );
    let by = assert_delivered_once_by(&site.core_catalog, &expected, &names);
    eprintln!(
        "{round} rounds in {} s: {} files of {} batches delivered once, by {:?}",
        started.elapsed().as_secs(),
        expected.len(),
        round,
        by.values().collect::<std::collections::BTreeSet<_>>()
    );
}
