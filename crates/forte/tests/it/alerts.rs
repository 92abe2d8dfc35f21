//! The failure hook (`--on-failure`) tells when a failure starts, reminds while it persists
//! (after `--on-failure-repeat`, doubling) and tells when it clears: not every failed attempt.

use std::path::Path;

use crate::common::site::{
    signal_and_wait, spawn_logged, start_relay_with, wait_for, write_batch, Site,
};

/// The hook's lines so far: `EVENT|ROLE|SITE|BATCH|FAILURES`, in the order it ran.
fn hook_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A hook that appends what it was told to `log`.
fn hook_into(log: &Path) -> String {
    format!(
        "echo \"$FORTE_EVENT|$FORTE_ROLE|$FORTE_SITE|$FORTE_BATCH|$FORTE_FAILURES\" >> '{}'",
        log.display()
    )
}

/// Three batches the relay refuses at every scan (the site's quota is smaller than any of
/// them, and nothing waits for the core, so every upload is refused at once) fail again and
/// again: the hook says `failed` once for each, with the site and the batch's name. The relay
/// restarted without the quota takes them: the hook says `cleared` once for each, and nothing
/// else.
#[test]
fn the_hook_fires_once_per_stuck_batch_and_once_when_it_clears() {
    let mut site = Site::with_relay_flags(&["--quota-per-site", "1KiB"]);
    let inbox = site.root.join("inbox");
    let batches = ["b1", "b2", "b3"];
    for name in batches {
        write_batch(&inbox, name, 2, 20_000);
    }
    let hook_log = site.root.join("hook.log");
    let hook = hook_into(&hook_log);
    let log = site.root.join("send.log");
    let args = site.send(&["--watch", "--interval", "1", "--on-failure", &hook]);
    let mut sender = spawn_logged(&args, &log);
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    // Each batch's failure was logged three times at least (a file's upload, its batch, at each scan).
    let failed_thrice = |name: &str| {
        let needle = format!("edge failure, batch {name}:");
        said().matches(&needle).count() >= 3
    };
    assert!(
        wait_for(60, || batches.iter().all(|b| failed_thrice(b))),
        "{}",
        said()
    );
    let mut told = hook_lines(&hook_log);
    told.sort();
    assert_eq!(
        told,
        [
            "failed|edge|site-a|b1|1",
            "failed|edge|site-a|b2|1",
            "failed|edge|site-a|b3|1"
        ],
        "{}",
        said()
    );

    // Room at the relay: the next scan sends them.
    let _ = site.relay.child.kill();
    let _ = site.relay.child.wait();
    let listen = site.relay.listen.clone();
    site.relay = start_relay_with(&site.root, &listen, &[]);
    assert!(
        wait_for(60, || hook_lines(&hook_log).len() >= 6),
        "{:?}\n{}",
        hook_lines(&hook_log),
        said()
    );
    let status = signal_and_wait(&mut sender, libc::SIGTERM, 30);
    assert!(status.is_some_and(|s| s.success()), "{}", said());
    let told = hook_lines(&hook_log);
    assert_eq!(told.len(), 6, "{told:?}");
    let mut cleared: Vec<(String, u64)> = told[3..]
        .iter()
        .map(|line| {
            let fields: Vec<&str> = line.split('|').collect();
            assert_eq!(fields[..3], ["cleared", "edge", "site-a"], "{line}");
            (fields[3].to_owned(), fields[4].parse().unwrap())
        })
        .collect();
    cleared.sort();
    let names: Vec<&str> = cleared.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, batches);
    assert!(cleared.iter().all(|(_, n)| *n >= 3), "{told:?}");
}
