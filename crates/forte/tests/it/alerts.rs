//! The failure hook (`--on-failure`) tells when a failure starts, reminds while it persists
//! (after `--on-failure-repeat`, doubling) and tells when it clears: not every failed attempt.

use std::path::Path;

use crate::common::site::{
    free_addr, http_get, kill, signal_and_wait, spawn_logged, start_relay_with, visible, wait_for,
    write_batch, Site,
};
use crate::common::*;

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
        let needle = format!("edge failure, batch {name} ");
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

/// `GET /api/v1/overview` at `addr`: its critical alerts' texts.
fn critical_alerts(addr: &str) -> Vec<String> {
    let Some((200, body)) = http_get(addr, "/api/v1/overview", &[]) else {
        return vec!["(no answer)".into()];
    };
    let overview: serde_json::Value = serde_json::from_str(&body).expect(&body);
    overview["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["level"] == "critical")
        .map(|a| a["text"].as_str().unwrap().to_owned())
        .collect()
}

/// Two batches signed by a key the core does not trust yet fail at the core: two critical
/// alerts in its dashboard. One is cancelled at its edge: the relay stops offering it and its
/// alert goes. The key is then trusted (SIGHUP): the other is delivered and its alert goes too.
#[test]
fn the_dashboards_alert_goes_when_a_failed_batch_is_cancelled_or_delivered() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write_batch(&inbox, "to-cancel", 1, 5_000);
    write_batch(&inbox, "to-deliver", 1, 5_000);
    let other = keygen(&site.root.join("other-keys"));
    ok(&site.send_signed_by(&other));

    let trusted = site.root.join("trusted.pub");
    std::fs::copy(&site.keys.edge_pub, &trusted).unwrap();
    let addr = free_addr();
    let mut pull = site.pull();
    let at = pull.iter().position(|a| a == "--trust").unwrap() + 1;
    pull[at] = format!("site-a={}", trusted.display()).into();
    pull.extend(args!["--watch", "--interval", "1", "--http", &addr]);
    let log = site.root.join("pull.log");
    let mut puller = spawn_logged(&pull, &log);
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_for(30, || critical_alerts(&addr).len() == 2),
        "{:?}\n{}",
        critical_alerts(&addr),
        said()
    );

    let mut cancel = site.send_signed_by(&other);
    cancel.extend(args!["--cancel", "to-cancel"]);
    ok(&cancel);
    assert!(
        wait_for(30, || critical_alerts(&addr).len() == 1),
        "{:?}\n{}",
        critical_alerts(&addr),
        said()
    );

    let mut keys = std::fs::read(&trusted).unwrap();
    keys.extend(std::fs::read(&other.edge_pub).unwrap());
    write(&trusted, &keys);
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(puller.0.id() as i32, libc::SIGHUP) };
    let dest = site.root.join("dest");
    // The alert goes as the batch is taken again, a moment before its files are in place.
    let delivered = || visible(&dest).contains_key("site-a/to-deliver/bags/000.bag");
    assert!(
        wait_for(60, || critical_alerts(&addr).is_empty() && delivered()),
        "{:?}\n{}",
        critical_alerts(&addr),
        said()
    );
    let delivered: Vec<String> = visible(&dest).into_keys().collect();
    assert_eq!(delivered, ["site-a/to-deliver/bags/000.bag"]);
    kill(&mut puller);
}
