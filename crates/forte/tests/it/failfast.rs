//! What no retry can fix fails at once, with one message that says what to change: a wrong
//! `--relay-fingerprint`, a relay URL that is not `https://`, an address where no TLS relay
//! answers, a token the relay refuses. What can heal (a relay that is down) is still retried.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::site::*;
use crate::common::*;

/// Generous for CI; before the fix these took 41 to 58 s.
const PROMPT: Duration = Duration::from_secs(5);

const WRONG_PIN: &str = "1111111111111111111111111111111111111111111111111111111111111111";

fn one_batch(site: &Site) {
    let dir = site.root.join("inbox/truck-1-run-1");
    write(&dir.join("data.bin"), &sample_bytes(200_000, 1));
    write(&dir.join(".ready"), b"");
}

/// Runs a command that must fail (exit code 1) promptly, without a retry; returns its stderr.
fn fails_at_once(args: &Args, relay_url: &str) -> String {
    let started = Instant::now();
    let stderr = fails(args);
    let took = started.elapsed();
    assert!(
        took < PROMPT,
        "took {:.1} s to fail:\n{stderr}",
        took.as_secs_f64()
    );
    assert!(!stderr.contains("retrying"), "retried:\n{stderr}");
    for line in stderr.lines() {
        assert!(
            line.matches(relay_url).count() <= 1,
            "the URL more than once in one line: {line}"
        );
    }
    stderr
}

fn assert_says(stderr: &str, what: &[&str]) {
    for w in what {
        assert!(stderr.contains(w), "no {w:?} in:\n{stderr}");
    }
}

#[test]
fn a_wrong_fingerprint_fails_send_at_once() {
    let site = Site::new();
    one_batch(&site);
    let send = with(site.send(&["-q"]), "--relay-fingerprint", WRONG_PIN);
    let stderr = fails_at_once(&send, &site.relay.url);
    assert_says(
        &stderr,
        &[
            "does not match --relay-fingerprint",
            &site.relay.fingerprint,
            "`forte relay` printed",
        ],
    );
    assert!(site.relay_objects().is_empty());
}

#[test]
fn a_wrong_fingerprint_fails_pull_at_once() {
    let site = Site::new();
    let pull = with(site.pull(), "--relay-fingerprint", WRONG_PIN);
    let stderr = fails_at_once(&pull, &site.relay.url);
    assert_says(
        &stderr,
        &[
            "does not match --relay-fingerprint",
            &site.relay.fingerprint,
        ],
    );
    // One line: the error, once.
    assert_eq!(stderr.matches("does not match").count(), 1, "{stderr}");
}

#[test]
fn an_http_url_is_refused_before_connecting() {
    let site = Site::new();
    one_batch(&site);
    let http = site.relay.url.replace("https://", "http://");
    for args in [
        with(site.send(&["-q"]), "--relay", &http),
        with(site.pull(), "--relay", &http),
    ] {
        let stderr = fails_at_once(&args, &http);
        assert_says(&stderr, &["relay URL must start with https://"]);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

#[test]
fn an_address_where_no_tls_relay_answers_fails_at_once() {
    // A plain HTTP server where the relay should be.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut stream in listener.incoming().flatten() {
            let _ = stream.read(&mut [0u8; 1024]);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        }
    });
    let site = Site::new();
    let url = format!("https://{addr}");
    let stderr = fails_at_once(&with(site.pull(), "--relay", &url), &url);
    assert_says(&stderr, &["no TLS relay answered", "--relay"]);
}

#[test]
fn a_refused_token_fails_at_once_and_names_the_token_file() {
    let site = Site::new();
    one_batch(&site);
    let wrong = site.root.join("wrong.token");
    write(&wrong, b"not-a-token-0123456789abcdef");
    let send = with(site.send(&["-q"]), "--token-file", &wrong);
    let pull = with(site.pull(), "--token-file", &wrong);
    for args in [send, pull] {
        let stderr = fails_at_once(&args, &site.relay.url);
        assert_says(&stderr, &["refused the token", "401", "--token-file"]);
    }
    // A valid token of the wrong role: the edge's token cannot pull.
    let pull = with(site.pull(), "--token-file", site.root.join("edge.token"));
    let stderr = fails_at_once(&pull, &site.relay.url);
    assert_says(&stderr, &["403", "core token"]);
}

/// Lines of a daemon's log that are failure events (target `forte::failure`), and lines that
/// announce a retry.
fn log_lines(log: &Path, what: &str) -> (usize, usize) {
    let text = std::fs::read_to_string(log).unwrap();
    let failures = text
        .lines()
        .filter(|l| l.contains(what) && (l.contains("forte::failure") || l.starts_with("error")))
        .count();
    let retries = text.lines().filter(|l| l.contains("retrying")).count();
    (failures, retries)
}

#[test]
fn daemons_report_a_wrong_fingerprint_once_per_look_without_retrying() {
    let site = Site::new();
    one_batch(&site);
    let daemon = |args: Args| with(args, "--relay-fingerprint", WRONG_PIN);
    let mut send = site.send(&["--watch", "--interval", "60"]);
    send = daemon(send);
    let mut pull = site.pull();
    pull.extend(args!["--watch", "--interval", "60"]);
    pull = daemon(pull);
    let (send_log, pull_log) = (site.root.join("send.log"), site.root.join("pull.log"));
    let (_send, _pull) = (
        spawn_logged(&send, &send_log),
        spawn_logged(&pull, &pull_log),
    );
    let reported = |log: &Path| log_lines(log, "does not match --relay-fingerprint").0 >= 1;
    assert!(
        wait_for(10, || reported(&send_log) && reported(&pull_log)),
        "send:\n{}\npull:\n{}",
        std::fs::read_to_string(&send_log).unwrap(),
        std::fs::read_to_string(&pull_log).unwrap()
    );
    // Before the fix each retried with backoff: 0.5, 1, 2 s…
    std::thread::sleep(Duration::from_secs(3));
    for log in [&send_log, &pull_log] {
        let (failures, retries) = log_lines(log, "does not match --relay-fingerprint");
        let text = std::fs::read_to_string(log).unwrap();
        assert_eq!((failures, retries), (1, 0), "{}:\n{text}", log.display());
    }
}

#[test]
fn a_relay_that_is_down_is_still_retried() {
    let site = Site::new();
    // A port nobody listens on: connection refused, which heals when the relay is back.
    let down = format!("https://{}", free_addr());
    let mut pull = with(site.pull(), "--relay", &down);
    pull.extend(args!["--watch", "--interval", "60"]);
    let log = site.root.join("pull.log");
    let _pull = spawn_logged(&pull, &log);
    assert!(
        wait_for(10, || log_lines(&log, "").1 >= 2),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
}

/// With nothing ready to send, `send` does not contact the relay: a relay that is down or
/// unreachable does not hold up (or fail) a run that has nothing to do.
#[test]
fn an_inbox_with_nothing_ready_does_not_contact_the_relay() {
    let site = Site::new();
    std::fs::create_dir_all(site.root.join("inbox")).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let out = ok(&with(site.send(&[]), "--relay", &url));
    assert!(out.contains("sent 0 batches"), "{out}");
    listener.set_nonblocking(true).unwrap();
    let contacted = listener.accept();
    assert!(
        matches!(&contacted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "send connected to the relay: {contacted:?}"
    );
}
