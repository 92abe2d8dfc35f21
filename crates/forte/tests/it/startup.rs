//! Start-up validation and error messages (issue 14): wrong settings stop a command before it
//! does anything, with a message that names the setting and the fix, and errors never show a
//! client the relay's file system.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::site::*;
use crate::common::*;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Runs forte, which must exit by itself within `seconds` (it is killed and the test fails if
/// not: a daemon that should have refused to start is serving instead).
fn exits_within(seconds: u64, args: &Args) -> Output {
    let mut child = forte()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(seconds);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "forte {args:?} still running after {seconds} s:\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn secret_keys_that_group_or_others_may_read_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    // keygen writes the secret halves for the owner only; the public ones may be read by all.
    assert_eq!(mode(&keys.core_key), 0o600);
    assert_eq!(mode(&keys.edge_key), 0o600);
    assert_eq!(mode(&keys.core_pub), 0o644);
    assert_eq!(mode(&keys.edge_pub), 0o644);
    let src = tmp.path().join("src");
    write(&src.join("a.txt"), b"a");

    // An edge key readable by everyone: pack stops before writing anything.
    chmod(&keys.edge_key, 0o644);
    let out = tmp.path().join("out");
    let err = fails(&args![
        "pack",
        &src,
        "--to",
        &out,
        "--recipient",
        &keys.core_pub,
        "--sign",
        &keys.edge_key,
        "-q",
    ]);
    assert!(
        err.contains(&format!("{} has mode 0644", keys.edge_key.display()))
            && err.contains(&format!("chmod 600 {}", keys.edge_key.display())),
        "{err}"
    );
    assert!(!out.exists(), "pack wrote output with a refused key");

    // Fixed as told, it packs; a core key readable by the group is refused by unpack.
    chmod(&keys.edge_key, 0o600);
    pack(&keys, &src, &out);
    chmod(&keys.core_key, 0o640);
    let dest = tmp.path().join("dest");
    let err = fails(&unpack_args(&keys, &out, &dest));
    assert!(
        err.contains(&format!("{} has mode 0640", keys.core_key.display()))
            && err.contains(&format!("chmod 600 {}", keys.core_key.display())),
        "{err}"
    );
    assert!(is_empty_dir(&dest));
    chmod(&keys.core_key, 0o600);
    ok(&unpack_args(&keys, &out, &dest));
    assert_eq!(std::fs::read(dest.join("a.txt")).unwrap(), b"a");
}

#[test]
fn a_relay_with_a_token_listed_twice_does_not_start() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = "shared-secret-0123456789abcdef";
    let tokens = tmp.path().join("tokens.toml");
    write(
        &tokens,
        format!(
            "[[token]]\ntoken = \"edge-a-0123456789abcdef\"\nrole = \"edge\"\nsite = \"site-a\"\n\
             [[token]]\ntoken = \"{secret}\"\nrole = \"edge\"\nsite = \"site-b\"\n\
             [[token]]\ntoken = \"{secret}\"\nrole = \"core\"\nsites = [\"*\"]\n"
        )
        .as_bytes(),
    );
    let out = exits_within(
        30,
        &args![
            "relay",
            "--listen",
            "127.0.0.1:0",
            "--store",
            tmp.path().join("store"),
            "--tokens",
            &tokens,
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("tokens.toml: token #3 (core of sites *) has the same token as token #2 (edge of site site-b)"),
        "{err}"
    );
    assert!(!err.contains(secret), "the token is printed: {err}");
}

#[test]
fn a_relay_storage_error_shows_the_client_no_paths_and_the_log_everything() {
    use forte_relay::client::{RelayClient, RelayEndpoint};
    use forte_relay::tls::RelayTrust;
    use sha2::Digest;

    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("relay.log");
    let relay = start_relay_logging_to(tmp.path(), &log);
    // A file where the relay keeps its temporary files: every upload of the site fails.
    let blocker = relay.store.join("sites/site-a/tmp");
    write(&blocker, b"not a directory");
    let edge = RelayClient::new(
        &RelayEndpoint {
            url: relay.url.clone(),
            token: EDGE_TOKEN.into(),
            trust: RelayTrust::Fingerprint(relay.fingerprint.clone()),
        },
        Duration::from_secs(30),
    )
    .unwrap();
    let body = b"sealed bytes";
    let sha = hex::encode(sha2::Sha256::digest(body));
    let id: forte_format::ObjectId = "0123456789abcdef0123456789abcdef".parse().unwrap();
    let e = edge.put_part(id, 0, body, &sha).unwrap_err();
    assert_eq!(e.status, Some(500), "{e}");
    assert!(e.message.contains("see the relay's log"), "{e}");
    let store = relay.store.display().to_string();
    assert!(
        !e.message.contains(&store) && !e.message.contains('/'),
        "the answer shows the relay's file system: {e}"
    );
    // The relay's own log keeps the detail: which path, and why.
    assert!(
        wait_for(10, || std::fs::read_to_string(&log)
            .unwrap()
            .contains(&blocker.display().to_string())),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
}

#[test]
fn a_layout_that_leaves_the_destination_stops_pull_at_start() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("run/file.bin"), b"payload");
    write(&inbox.join("run/.ready"), b"");
    ok(&site.send(&["-q"]));
    for layout in ["../x/{path}", "/abs/{path}", "{site}//{path}"] {
        let mut pull = site.pull();
        pull.extend(args!["--layout", layout]);
        let started = Instant::now();
        let err = fails(&pull);
        assert!(
            err.contains(&format!(
                "layout {layout:?} does not keep files inside the destination"
            )) && err.contains("{site}/{batch}/{path}"),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(20));
    }
    assert!(!site.root.join("x").exists() && !site.root.join("dest").exists());
    assert!(
        !site.relay_objects().is_empty(),
        "nothing was pulled, so the relay keeps it"
    );
    // Without {path}, files of a batch would collide.
    let mut pull = site.pull();
    pull.extend(args!["--layout", "{site}/{batch}"]);
    let err = fails(&pull);
    assert!(err.contains("must contain {path}"), "{err}");
}

#[test]
fn pull_says_to_move_a_different_file_away_not_to_pass_overwrite() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("run/file.bin"), b"payload");
    write(&inbox.join("run/.ready"), b"");
    ok(&site.send(&["-q"]));
    let target = site.root.join("dest/site-a/run/file.bin");
    write(&target, b"something else");
    let err = fails(&site.pull());
    assert!(
        err.contains(&format!(
            "{} already exists with other contents",
            target.display()
        )) && err.contains(&format!("move {} away", target.display())),
        "{err}"
    );
    assert!(
        !err.contains("--overwrite"),
        "pull has no --overwrite: {err}"
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"something else");
    assert!(!site.relay_objects().is_empty());
    // Doing what it says delivers the batch.
    std::fs::rename(&target, site.root.join("moved-away")).unwrap();
    ok(&site.pull());
    assert_eq!(std::fs::read(&target).unwrap(), b"payload");
    assert!(site.relay_objects().is_empty());

    // A directory in the way of a file: the same advice.
    write(&inbox.join("run2/file.bin"), b"payload 2");
    write(&inbox.join("run2/.ready"), b"");
    ok(&site.send(&["-q"]));
    let in_the_way = site.root.join("dest/site-a/run2/file.bin");
    std::fs::create_dir_all(&in_the_way).unwrap();
    let err = fails(&site.pull());
    assert!(
        err.contains(&format!(
            "{} already exists and is a directory, where a file is to go",
            in_the_way.display()
        )) && err.contains("move it away"),
        "{err}"
    );
    assert!(
        !err.contains("--overwrite"),
        "pull has no --overwrite: {err}"
    );
}

#[test]
fn pack_json_reports_a_name_that_is_not_utf8_as_skipped_and_packs_the_rest() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    write(&src.join("a.txt"), b"a");
    write(&src.join(OsStr::from_bytes(b"b\xff.txt")), b"b");
    let out = tmp.path().join("out");
    let json = ok(&args![
        "pack",
        &src,
        "--to",
        &out,
        "--recipient",
        &keys.core_pub,
        "--sign",
        &keys.edge_key,
        "--json",
        "-q",
    ]);
    let summary: serde_json::Value = crate::common::strict_json(&json);
    let rejected = summary["rejected"].as_array().unwrap();
    assert_eq!(rejected.len(), 1, "{summary:#}");
    let skipped = rejected[0]["path"].as_str().unwrap();
    assert!(skipped.ends_with("/b\u{FFFD}.txt"), "{skipped}");
    assert_eq!(rejected[0]["reason"], "name is not UTF-8");
    assert_eq!(summary["files"], 1, "{summary:#}");
    assert_eq!(summary["objects"][0]["path"], "a.txt");
    let dest = tmp.path().join("dest");
    ok(&unpack_args(&keys, &out, &dest));
    assert_eq!(tree(&dest).keys().collect::<Vec<_>>(), ["a.txt"]);
}

/// The inbox's lock is taken before anything else is read: a second send on an inbox another
/// process holds names the holder, even when its own settings are wrong too (here: no relay
/// and no keys). Settings were once resolved first, and this said "no relay URL" instead.
#[test]
fn a_send_on_a_held_inbox_names_the_holder_before_any_other_mistake() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let inbox = dir.path().join("inbox");
    std::fs::create_dir_all(inbox.join("b1")).unwrap();
    let mut holder = std::process::Command::new("flock")
        .arg(&inbox)
        .args(["-c", "echo held; exec sleep 60"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("flock (util-linux) runs");
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held");
    let err = fails(&args!["send", &inbox]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(err.contains("another forte send (PID"), "{err}");
}

/// `send` takes its site from its own configuration only (issue 57): with neither `--site` nor
/// `site` in `[send]` it stops at once, one-shot or watching, saying how to give it, before it
/// uploads anything; a dry run says the same in a note. It used to ask the relay.
#[test]
fn send_without_a_site_stops_at_once_naming_the_fix() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write_batch(&inbox, "run-a", 2, 10_000);
    let fix =
        "send needs its site: pass --site NAME or set site in [send] of the configuration file";
    for extra in [&["-q"][..], &["--watch", "--interval", "1"]] {
        let out = exits_within(10, &site.send_without_site(extra));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {stderr}");
        assert!(stderr.contains(fix), "{extra:?}: {stderr}");
    }
    assert_eq!(site.relay_holdings(), Vec::<std::path::PathBuf>::new());
    let plan = ok(&args!["send", &inbox, "--dry-run"]);
    assert!(
        plan.contains("note: no site (--site NAME, or site in [send]): send would refuse to start"),
        "{plan}"
    );
}

/// A site name the core would refuse for ever (`a b/../../c`) is refused at the edge by the
/// core's own rule, from the flag and from the configuration file alike, each error naming
/// where it came from, before anything is uploaded (a name from the file was refused as if
/// it were `--site`'s).
#[test]
fn a_site_name_the_core_would_refuse_is_refused_before_anything_is_uploaded() {
    let site = Site::new();
    write_batch(&site.root.join("inbox"), "run-a", 2, 10_000);
    let bad = "a b/../../c";
    let mut flag = site.send(&["-q"]);
    let at = flag.iter().position(|a| a == "--site").unwrap();
    flag[at + 1] = bad.into();
    let config = site.root.join("edge.toml");
    write(&config, format!("[send]\nsite = \"{bad}\"\n").as_bytes());
    let mut from_file = args!["--config", &config];
    from_file.extend(site.send_without_site(&["-q"]));
    for (args, names) in [
        (flag, "--site"),
        (from_file, "send.site = \"a b/../../c\": "),
    ] {
        let out = exits_within(10, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains(names) && stderr.contains(&format!("{bad:?} is not a site name")),
            "{stderr}"
        );
    }
    assert_eq!(site.relay_holdings(), Vec::<std::path::PathBuf>::new());
}
