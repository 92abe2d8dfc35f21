//! Load: 10 000 small files in one batch, and 50 batches ready at once, sent and pulled
//! through a relay on loopback. Every file must arrive identical and each process's peak
//! memory must stay bounded. Files are 1–100 kB here to keep CI short; `bench/load.py` runs
//! the full 1–500 kB sizes on the release binary and its results are in docs/reliability.md.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use crate::common::site::*;
use crate::common::*;

/// Peak resident memory a leg may use. It does not grow with the number of files: parts in
/// flight and queues are bounded, and file lists are a few hundred bytes per file.
const PEAK_RSS_LIMIT_MIB: f64 = 256.0;

/// Writes `count` files of 1–100 kB under `batch` (half random bytes, half text), marks the
/// batch ready, and returns their total size.
fn small_files(batch: &Path, count: usize, seed: u64) -> u64 {
    let text = sample_bytes(100_000, seed);
    let (mut total, mut x) = (0, seed | 1);
    for i in 0..count {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let size = 1_000 + (x % 99_000) as usize;
        let path = batch.join(format!("d{:02}/f{i:05}.dat", i / 1000));
        if i % 2 == 0 {
            write(&path, &text[..size]);
        } else {
            write(&path, &random_bytes(size as u64));
        }
        total += size as u64;
    }
    write(&batch.join(".ready"), b"");
    total
}

/// Runs forte to completion; returns its wall time in seconds and peak RSS in MiB.
// The child is reaped by wait4, which `Child` does not know of; it also returns the peak RSS.
#[allow(clippy::zombie_processes)]
fn measured(args: &Args) -> (f64, f64) {
    let start = Instant::now();
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = forte()
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: the pid is our own child, not yet waited for; status and usage are ours.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4");
    let stderr = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "forte {args:?} failed: status {status}: {stderr}"
    );
    // The catalogue's own connections (the writer, a lease renewed beside it) never make
    // each other wait as if the database were away.
    assert!(
        !stderr.contains("unavailable"),
        "forte {args:?} found its own catalogue unavailable: {stderr}"
    );
    (
        start.elapsed().as_secs_f64(),
        usage.ru_maxrss as f64 / 1024.0,
    )
}

fn expected(inbox: &Path) -> BTreeMap<String, String> {
    let mut all = BTreeMap::new();
    for batch in std::fs::read_dir(inbox).unwrap().flatten() {
        let name = batch.file_name().to_string_lossy().into_owned();
        for (p, h) in source_hashes(&batch.path()) {
            all.insert(format!("site-a/{name}/{p}"), h);
        }
    }
    all
}

/// Sends and pulls everything in the site's inbox, checks it arrived identical, and prints
/// the rates; fails if a leg's memory passed the limit.
fn send_and_pull(site: &Site, what: &str, files: usize, bytes: u64) {
    let (send_s, send_rss) = measured(&site.send(&["-q"]));
    let (pull_s, pull_rss) = measured(&site.pull());
    assert_eq!(
        visible(&site.root.join("dest")),
        expected(&site.root.join("inbox")),
        "{what}: not everything arrived identical"
    );
    assert!(site.relay_objects().is_empty(), "{what}: all acknowledged");
    println!(
        "{what}: {files} files, {:.0} MB: send {:.0} files/s, peak RSS {send_rss:.0} MiB; \
         pull {:.0} files/s, peak RSS {pull_rss:.0} MiB",
        bytes as f64 / 1e6,
        files as f64 / send_s,
        files as f64 / pull_s,
    );
    for (leg, rss) in [("send", send_rss), ("pull", pull_rss)] {
        assert!(
            rss < PEAK_RSS_LIMIT_MIB,
            "{what}: {leg} peaked at {rss:.0} MiB (limit {PEAK_RSS_LIMIT_MIB} MiB)"
        );
    }
}

#[test]
fn ten_thousand_small_files_in_one_batch() {
    let site = Site::new();
    let bytes = small_files(&site.root.join("inbox/many"), 10_000, 1);
    send_and_pull(&site, "one batch", 10_000, bytes);
}

#[test]
fn fifty_batches_at_once() {
    let site = Site::new();
    let bytes = (0..50)
        .map(|b| small_files(&site.root.join(format!("inbox/batch-{b:02}")), 20, b + 1))
        .sum();
    send_and_pull(&site, "50 batches", 1_000, bytes);
}
