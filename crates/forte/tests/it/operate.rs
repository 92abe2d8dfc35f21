//! What an operator lives with: a site run from configuration files alone, what `config
//! check` says of a bad one, the log's level and format, output a script can parse, and
//! catalogues that are never made by a lookup.

use std::path::Path;

use crate::common::site::{kill, spawn_logged, visible, wait_for, write_batch, Site};
use crate::common::*;

/// An edge's and a core's configuration files naming everything the flags would.
fn config_files(site: &Site) -> (std::path::PathBuf, std::path::PathBuf) {
    let (root, keys, relay) = (&site.root, &site.keys, &site.relay);
    let edge = root.join("etc/edge.toml");
    let core = root.join("etc/core.toml");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    let relay_section = format!(
        "[relay]\nurl = \"{}\"\nfingerprint = \"{}\"\n",
        relay.url, relay.fingerprint
    );
    write(
        &edge,
        format!(
            "catalog = \"{edge_catalog}\"\n\
             [keys]\nrecipient = [\"{core_pub}\"]\nsign = \"{edge_key}\"\nreceipt_pub = [\"{receipt_pub}\"]\n\
             {relay_section}token_file = \"../edge.token\"\n\
             [send]\ninbox = \"../inbox\"\nsite = \"site-a\"\nsettle = 0\n\
             [http]\nlisten = \"127.0.0.1:0\"\n\
             [log]\nlevel = \"warn\"\n",
            edge_catalog = site.edge_catalog,
            core_pub = keys.core_pub.display(),
            edge_key = keys.edge_key.display(),
            receipt_pub = keys.receipt_pub.display(),
        )
        .as_bytes(),
    );
    write(
        &core,
        format!(
            "catalog = \"{core_catalog}\"\n\
             [keys]\nidentity = \"{core_key}\"\ntrust = [\"site-a={edge_pub}\"]\nreceipt_key = \"{receipt_key}\"\n\
             {relay_section}token_file = \"../core.token\"\n\
             [pull]\nto = \"../dest\"\n",
            core_catalog = site.core_catalog,
            core_key = keys.core_key.display(),
            edge_pub = keys.edge_pub.display(),
            receipt_key = keys.receipt_key.display(),
        )
        .as_bytes(),
    );
    (edge, core)
}

/// Every setting from the files (relative paths from the file's directory), flags overriding
/// them, and each command's `--json` a single valid document even with the dashboard served
/// (it once printed `dashboard: http://…` before the JSON).
#[test]
fn a_site_runs_from_its_configuration_files_with_json_only_on_stdout() {
    let site = Site::new();
    let (edge, core) = config_files(&site);
    write_batch(&site.root.join("inbox"), "b1", 3, 20_000);
    let sent = strict_json(&ok(&args!["--config", &edge, "send", "--json"]));
    assert_eq!(sent["batches"][0]["sent"], 3, "{sent:#}");
    let pulled = strict_json(&ok(&args!["--config", &core, "pull", "--json"]));
    assert_eq!(pulled[0]["delivered_files"], 3, "{pulled:#}");
    assert_eq!(tree(&site.root.join("dest/site-a/b1")).len(), 3);
    let status = strict_json(&ok(&args!["--config", &core, "status", "--json"]));
    let batch = &status["batches"][0];
    assert_eq!(batch["batch"]["state"], "delivered", "{status:#}");
    assert_eq!(batch["batch"]["files"], 3);
    assert_eq!(batch["files"].as_array().unwrap().len(), 3);
    // A flag overrides its key: another destination.
    write_batch(&site.root.join("inbox"), "b2", 1, 1_000);
    ok(&args!["--config", &edge, "send", "-q"]);
    let other = site.root.join("elsewhere");
    ok(&args!["--config", &core, "pull", "--to", &other]);
    assert_eq!(tree(&other.join("site-a/b2")).len(), 1);
    assert!(!site.root.join("dest/site-a/b2").exists());

    // A file is found by its path in its batch (each lineage naming its batch: b1 and b2
    // both hold bags/000.bag), by BATCH/PATH, and by its delivered path, relative or not.
    let both = ok(&args![
        "--config",
        &core,
        "status",
        "--file",
        "bags/000.bag"
    ]);
    assert!(
        both.contains("batch b1: bags/000.bag") && both.contains("batch b2: bags/000.bag"),
        "{both}"
    );
    let one = ok(&args![
        "--config",
        &core,
        "status",
        "--file",
        "b2/bags/000.bag"
    ]);
    assert!(
        one.contains("batch b2: bags/000.bag") && !one.contains("batch b1"),
        "{one}"
    );
    let out = forte()
        .current_dir(site.root.join("dest"))
        .args([
            "--config",
            edge.to_str().unwrap(),
            "--catalog",
            &site.core_catalog,
        ])
        .args(["status", "--file", "site-a/b1/bags/001.bag", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let found = strict_json(std::str::from_utf8(&out.stdout).unwrap());
    let copied = site.root.join("dest/site-a/b1/bags/001.bag");
    let again = ok(&args!["--config", &core, "status", "--file", &copied]);
    assert!(again.contains("batch b1: bags/001.bag"), "{again}");
    assert_eq!(
        (&found[0]["batch"], &found[0]["file"]["path"]),
        (&serde_json::json!("b1"), &serde_json::json!("bags/001.bag")),
        "{found:#}"
    );
}

/// `config check` says what a file resolves to; a mistyped key or a bad value fails at once,
/// naming the key and, for a key, the keys its section has; nothing runs on a bad file.
#[test]
fn config_check_names_the_bad_key_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("relay.toml");
    write(
        &file,
        b"[relay_server]\nlisten = \"127.0.0.1:9443\"\nstore = \"store\"\ntokens = \"tokens.toml\"\n",
    );
    let out = ok(&args!["config", "check", &file]);
    assert!(out.contains("valid"), "{out}");
    // Relative paths as the run takes them: from the file's directory.
    let store = dir.path().join("store").display().to_string();
    assert!(
        out.lines()
            .any(|l| l.contains("store") && l.contains(&store) && l.ends_with("(file)")),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.contains("max_connections")
            && l.contains("768")
            && l.ends_with("(default)")),
        "{out}"
    );

    // The catalogue too is relative to the file, wherever the command runs (found by the
    // outside review: it was taken from the working directory, a second empty catalogue).
    write(&dir.path().join("cat.sqlite"), b"");
    write(&file, b"catalog = \"cat.sqlite\"\n");
    let out = forte()
        .current_dir("/")
        .args(["--config", file.to_str().unwrap(), "status"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && said.contains(&format!("{}", dir.path().join("cat.sqlite").display())),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    write(&file, b"[relay_server]\nmax_conections = 5\n");
    let e = fails(&args!["config", "check", &file]);
    assert!(
        e.contains("unknown key relay_server.max_conections") && e.contains("max_connections,"),
        "{e}"
    );
    let e = fails(&args!["--config", &file, "relay"]);
    assert!(e.contains("relay.toml is not valid: unknown key"), "{e}");

    write(&file, b"[relay_server]\nmax_connections = \"many\"\n");
    let e = fails(&args!["config", "check", &file]);
    assert!(
        e.contains("relay_server.max_connections = \"many\": invalid value"),
        "{e}"
    );
    write(&file, b"[daemon]\nwatch = \"yes\"\n");
    let e = fails(&args!["config", "check", &file]);
    assert!(e.contains("true or false"), "{e}");
}

/// The example configuration files of the packages are valid.
#[test]
fn the_example_configuration_files_are_valid() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/etc");
    let files: Vec<_> = std::fs::read_dir(&examples)
        .unwrap_or_else(|e| panic!("{}: {e}", examples.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    assert!(files.len() >= 3, "{files:?}");
    for file in files {
        let out = ok(&args!["config", "check", &file]);
        assert!(out.contains("valid"), "{}: {out}", file.display());
    }
}

/// The log's level: the flag over FORTE_LOG or RUST_LOG over the file; its format: text or
/// one JSON object per line, nothing else on stderr.
#[test]
fn the_log_level_and_format_are_the_operators() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    let mut stderr_of = |args: &[&str], env: &[(&str, &str)]| -> String {
        n += 1;
        let out_file = dir.path().join(format!("t{n}.token"));
        let mut cmd = forte();
        cmd.env_remove("FORTE_LOG").env_remove("RUST_LOG");
        cmd.envs(env.iter().copied()).args(args);
        cmd.args(["token", "--edge", "site-a", "--out"])
            .arg(&out_file);
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stderr).unwrap()
    };
    let info = stderr_of(&[], &[]);
    assert!(
        info.contains("INFO") && info.contains("token written"),
        "{info}"
    );
    assert_eq!(stderr_of(&[], &[("RUST_LOG", "error")]), "");
    assert!(stderr_of(&[], &[("RUST_LOG", "info")]).contains("token written"));
    assert_eq!(
        stderr_of(&["--log-level", "warn"], &[("RUST_LOG", "info")]),
        ""
    );
    let file = dir.path().join("quiet.toml");
    write(&file, b"[log]\nlevel = \"error\"\n");
    let config = file.display().to_string();
    assert_eq!(stderr_of(&["--config", &config], &[]), "");
    assert!(stderr_of(&["--config", &config], &[("FORTE_LOG", "info")]).contains("token written"));
    let json = stderr_of(&["--log-format", "json"], &[]);
    let lines = strict_json_lines(&json);
    assert_eq!(lines.len(), 1, "{json}");
    assert_eq!(lines[0]["level"], "INFO");
    assert!(lines[0]["fields"]["message"]
        .as_str()
        .unwrap()
        .contains("token written"));
    // A failure is a JSON line too.
    let out = forte()
        .args(["--log-format", "json", "--catalog"])
        .arg(dir.path().join("no/such.sqlite"))
        .arg("status")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let lines = strict_json_lines(std::str::from_utf8(&out.stderr).unwrap());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["level"], "ERROR");
}

/// A lookup never makes a catalogue: a mistyped path is an error naming it, and without
/// --catalog the readers take the one a writer on this host made.
#[test]
fn status_never_makes_a_catalogue() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("edeg.sqlite");
    let e = fails(&args!["--catalog", &typo, "status"]);
    assert!(
        e.contains(&format!("no catalogue at {}", typo.display())),
        "{e}"
    );
    assert!(!typo.exists());
    let state = dir.path().join("state");
    let status = |dir: &Path| {
        forte()
            .env("XDG_STATE_HOME", dir)
            .args(["status", "--json"])
            .output()
            .unwrap()
    };
    let out = status(&state);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("no catalogue in"),
        "{e}"
    );
    assert!(!state.exists(), "a lookup made {}", state.display());
    // The edge's default catalogue, made by the edge's first run, is the one status reads.
    std::fs::create_dir_all(state.join("forte")).unwrap();
    write(&state.join("forte/edge.sqlite"), b"");
    let out = status(&state);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let empty = strict_json(std::str::from_utf8(&out.stdout).unwrap());
    assert_eq!(
        (&empty["batches"], &empty["matched"]),
        (&serde_json::json!([]), &serde_json::json!(0)),
        "{empty:#}"
    );
}

/// A watching core whose trusted keys come from its configuration file reads the file's
/// `keys.trust` again on SIGHUP: a site's key added there is trusted without a restart.
#[test]
fn a_watching_core_reads_keys_trust_of_its_file_again_on_sighup() {
    let site = Site::new();
    let (_, core) = config_files(&site);
    let other = site.root.join("other-keys");
    ok(&args!["keygen", "--edge", "site-a", "--dir", &other]);
    let text = std::fs::read_to_string(&core).unwrap();
    let right = format!("site-a={}", site.keys.edge_pub.display());
    let wrong = format!("site-a={}", other.join("site-a.pub").display());
    write(&core, text.replace(&right, &wrong).as_bytes());
    let log = site.root.join("pull.log");
    let puller = spawn_logged(
        &args!["--config", &core, "pull", "--watch", "--interval", "1"],
        &log,
    );
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    write_batch(&site.root.join("inbox"), "first", 1, 10_000);
    ok(&site.send(&["-q"]));
    assert!(
        wait_for(30, || said().contains("not among the trusted edge keys")),
        "{}",
        said()
    );
    write(&core, text.as_bytes());
    unsafe { libc::kill(puller.0.id() as i32, libc::SIGHUP) };
    let first = site.root.join("dest/site-a/first");
    assert!(wait_for(30, || visible(&first).len() == 1), "{}", said());
}

/// On a terminal, `send`'s progress bar shows the dashboard's ETA (its rate over the last
/// seconds and the bytes still to leave), once a rate can be told. The terminal is `script`'s.
#[test]
fn the_progress_bar_shows_the_dashboards_eta() {
    let site = Site::new();
    let batch = site.root.join("inbox/slow");
    for i in 0..3 {
        write(&batch.join(format!("{i}.bin")), &random_bytes(3_000_000));
    }
    write(&batch.join(".ready"), b"");
    let mut send = site.send(&["--bwlimit", "1MB", "--part-size", "1MiB"]);
    let binary = std::env::var_os("FORTE_TEST_BINARY")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_forte").into());
    send.insert(0, binary.into_os_string());
    let line: Vec<String> = send
        .iter()
        .map(|a| format!("'{}'", a.to_string_lossy().replace('\'', "'\\''")))
        .collect();
    let typescript = site.root.join("typescript");
    let status = std::process::Command::new("script")
        .args(["-qefc", &line.join(" ")])
        .arg(&typescript)
        .env("COLUMNS", "200")
        .status()
        .expect("script (util-linux) runs");
    let shown = String::from_utf8_lossy(&std::fs::read(&typescript).unwrap()).into_owned();
    assert!(status.success(), "{shown}");
    assert!(
        shown.contains(" · ETA "),
        "no ETA on the terminal:\n{shown}"
    );
}

/// What the outside review of issue 44 found at the inbox: a batch named to forge a log line
/// is skipped and shown escaped (never as a line of its own), an empty batch (only its
/// marker) is not said delivered and deleted, and the batch beside them goes.
#[test]
fn an_inbox_cannot_forge_log_lines_and_empty_batches_wait() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write_batch(&inbox, "good", 1, 1_000);
    let forged =
        "evil\n2026-01-01T00:00:00Z  INFO forte_edge: batch run-7: acknowledged\u{1b}]0;owned\u{7}";
    write_batch(&inbox, forged, 1, 1_000);
    write(&inbox.join("empty/.ready"), b"");
    let out = run(&site.send(&["--json"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let sent = strict_json(std::str::from_utf8(&out.stdout).unwrap());
    let names: Vec<&str> = sent["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["batch"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["good"], "{sent:#}");
    assert!(stderr.contains(r#"skipping batch "evil\n2026"#), "{stderr}");
    assert!(
        !stderr.lines().any(|l| l.starts_with("2026-01-01")),
        "a forged line: {stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "an escape reached the terminal: {stderr:?}"
    );
    assert!(inbox.join("empty/.ready").exists());
}

/// A batch whose sources could not be deleted (here: its directory immutable, as a directory
/// the edge may not write) is kept; once the operator fixed it and touched its ready marker,
/// the next look deletes what the core's receipt lists (found by the fresh-eyes walkthrough:
/// the batch stayed kept for good).
#[test]
fn a_kept_batch_is_deleted_after_its_marker_is_touched() {
    if !crate::common::machine::may_use_the_machine("chattr +i") {
        return;
    }
    let site = Site::new();
    let batch = write_batch(&site.root.join("inbox"), "run", 1, 10_000);
    ok(&site.send(&["-q"]));
    ok(&site.pull());
    let chattr = |flag: &str| {
        let done = std::process::Command::new("chattr")
            .arg(flag)
            .arg(batch.join("bags"))
            .status();
        assert!(done.unwrap().success(), "chattr {flag}");
    };
    chattr("+i");
    let log = site.root.join("send.log");
    let mut sender = spawn_logged(
        &site.send(&["--watch", "--interval", "1", "--delete-after-ack"]),
        &log,
    );
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    let kept = wait_for(60, || said().contains("cannot delete"));
    chattr("-i");
    assert!(kept, "{}", said());
    assert!(batch.join("bags/000.bag").exists());
    write(&batch.join(".ready"), b"");
    assert!(wait_for(60, || !batch.exists()), "{}", said());
    kill(&mut sender);
}
