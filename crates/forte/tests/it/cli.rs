//! The command line: help everywhere, and clear errors that name the file and the fix.

use crate::common::*;

#[test]
fn every_command_has_help() {
    for command in [
        vec!["--help"],
        vec!["keygen", "--help"],
        vec!["pack", "--help"],
        vec!["unpack", "--help"],
        vec!["demo", "--help"],
        vec!["relay", "--help"],
        vec!["send", "--help"],
        vec!["pull", "--help"],
        vec!["status", "--help"],
        vec!["report", "--help"],
        vec!["ingest", "--help"],
        vec!["bench", "--help"],
        vec!["bench", "compress", "--help"],
    ] {
        let out = forte().args(&command).output().unwrap();
        assert!(out.status.success(), "{command:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("Usage: forte"), "{command:?}: {text}");
    }
}

#[test]
fn missing_keys_say_which_flag_or_config_key_to_set() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write(&src.join("a"), b"a");
    let err = fails(&args!["pack", &src, "--to", tmp.path().join("out")]);
    assert!(
        err.contains("--recipient") && err.contains("keys.recipient"),
        "{err}"
    );
    let err = fails(&args![
        "unpack",
        tmp.path().join("out"),
        "--to",
        tmp.path().join("d")
    ]);
    assert!(
        err.contains("--identity") && err.contains("keys.identity"),
        "{err}"
    );
}

#[test]
fn keys_can_come_from_the_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let config = tmp.path().join("forte.toml");
    write(
        &config,
        b"[keys]\nrecipient = \"keys/core.pub\"\nsign = \"keys/edge.key\"\nidentity = \"keys/core.key\"\ntrust = [\"keys/edge.pub\"]\n[prepare]\npart_size = \"1MiB\"\n",
    );
    let src = tmp.path().join("src");
    write(&src.join("data.bin"), &sample_bytes(3 << 20, 5));
    let packed = tmp.path().join("packed");
    ok(&args![
        "--config", &config, "pack", &src, "--to", &packed, "-q"
    ]);
    let object = objects(&packed).pop().unwrap();
    assert_eq!(
        manifest_json(&keys, &object)["parts"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let dest = tmp.path().join("dest");
    ok(&args![
        "--config", &config, "unpack", &packed, "--to", &dest, "-q"
    ]);
    assert_eq!(tree(&src), tree(&dest));
}

#[test]
fn a_malformed_config_names_the_file_and_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("bad.toml");
    write(&config, b"[prepare]\nlevel = \"three\"\n");
    let err = fails(&args![
        "--config",
        &config,
        "pack",
        tmp.path(),
        "--to",
        tmp.path().join("o")
    ]);
    assert!(err.contains("bad.toml") && err.contains("level"), "{err}");
    assert!(!tmp.path().join("o").exists());
}

#[test]
fn wrong_key_files_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    write(&src.join("a"), b"a");
    // The edge's private key given where the core's public key belongs.
    let err = fails(&args![
        "pack",
        &src,
        "--to",
        tmp.path().join("o"),
        "--recipient",
        &keys.edge_key,
        "--sign",
        &keys.edge_key,
    ]);
    assert!(err.contains("edge.key") && err.contains("age1"), "{err}");
    let err = fails(&args!["keygen", "--dir", &keys.dir]);
    assert!(err.contains("already exists"), "{err}");
}

#[test]
fn output_inside_the_source_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    write(&src.join("a"), b"a");
    let err = fails(&args![
        "pack",
        &src,
        "--to",
        src.join("out"),
        "--recipient",
        &keys.core_pub,
        "--sign",
        &keys.edge_key,
    ]);
    assert!(err.contains("inside the source"), "{err}");
}

#[test]
fn symlinks_and_special_files_are_skipped_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    write(&src.join("real.txt"), b"real\n");
    std::os::unix::fs::symlink("/etc/passwd", src.join("passwd-link")).unwrap();
    let fifo = src.join("pipe");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let out = run(&args![
        "pack",
        &src,
        "--to",
        tmp.path().join("packed"),
        "--recipient",
        &keys.core_pub,
        "--sign",
        &keys.edge_key,
    ]);
    assert!(out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("passwd-link") && err.contains("symbolic link"),
        "{err}"
    );
    assert!(
        err.contains("pipe") && err.contains("not a regular file"),
        "{err}"
    );
    let dest = tmp.path().join("dest");
    ok(&unpack_args(&keys, &tmp.path().join("packed"), &dest));
    assert_eq!(tree(&dest).keys().collect::<Vec<_>>(), ["real.txt"]);
}

#[test]
fn demo_runs_and_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    // Run as a user would, from a directory with a relative --dir.
    let out = forte()
        .args(["demo", "--dir", "demo"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let (text, errors) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    );
    assert!(out.status.success(), "{text}\n{errors}");
    assert!(text.contains("identical to the source"), "{text}");
    assert!(
        !errors.contains("WARN") && !text.contains("sustainable"),
        "{text}\n{errors}"
    );
    assert!(text.contains("docs/install.md"), "{text}");
    // Its sample data compresses like recordings (2-3x), offline and on the wire.
    for ratio in [
        ratio_after(&text, "ratio "),
        ratio_after(&text, "compression ratio "),
    ] {
        assert!((2.0..3.0).contains(&ratio), "ratio {ratio}: {text}");
    }
    // Every step is printed as the command a user types, paths relative to here.
    let commands: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("$ "))
        .collect();
    for step in [
        "forte keygen --core --dir demo/keys",
        "forte keygen --edge demo-site --dir demo/keys",
        "forte pack demo/sample --to demo/packed --recipient demo/keys/core.pub",
        "forte unpack demo/packed --to demo/restored --identity demo/keys/core.key",
        "forte token --edge demo-site --out demo/demo-site.token >> demo/tokens.toml",
        "forte relay --listen 127.0.0.1:0 --store demo/relay --tokens demo/tokens.toml",
        "forte --catalog demo/edge.sqlite send demo/inbox --relay https://127.0.0.1:",
        "forte --catalog demo/core.sqlite pull --to demo/dest --relay https://127.0.0.1:",
        "forte --catalog demo/core.sqlite status",
        "forte --catalog demo/edge.sqlite report --with demo/core.sqlite --charts demo/charts",
    ] {
        assert!(
            commands.iter().any(|c| c.starts_with(step)),
            "{step} in {commands:#?}"
        );
    }
    // The catalogue's and the report's commands work when pasted into a shell here.
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(forte().get_program(), bin.join("forte")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (step, says) in [
        (" status --file ", "delivered to demo-site/batch-A/can.log"),
        (" report ", "14 of 14 batches delivered"),
    ] {
        let line = commands.iter().find(|c| c.contains(step)).unwrap();
        let pasted = std::process::Command::new("sh")
            .args(["-c", line])
            .env("PATH", &path)
            .current_dir(tmp.path())
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&pasted.stdout),
            String::from_utf8_lossy(&pasted.stderr),
        );
        assert!(pasted.status.success(), "{line}: {stdout}{stderr}");
        assert!(
            stdout.contains(says) && !stderr.contains("WARN"),
            "{line}: {stdout}{stderr}"
        );
    }
    assert!(dir.join("charts/utilisation.png").exists());
    // A second run replaces its own directory.
    ok(&args!["demo", "--dir", &dir]);
    // It never clears a directory it did not make.
    let other = tmp.path().join("precious");
    write(&other.join("keep.txt"), b"keep");
    let err = fails(&args!["demo", "--dir", &other]);
    assert!(err.contains("not made by `forte demo`"), "{err}");
    assert!(other.join("keep.txt").exists());
}

/// The number after the first `label` in `text` (a compression ratio the demo printed).
fn ratio_after(text: &str, label: &str) -> f64 {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("{label:?} in {text}"))
        + label.len();
    let number: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    number.parse().unwrap()
}

#[test]
fn level_auto_adapts_within_its_bounds_and_restores_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    for i in 0..6 {
        write(&src.join(format!("{i}.log")), &sample_bytes(3 << 20, i));
    }
    let config = tmp.path().join("forte.toml");
    write(
        &config,
        b"[prepare]\nlevel = \"auto\"\npart_size = \"1MiB\"\n",
    );
    let packed = tmp.path().join("packed");
    ok(&args![
        "--config",
        &config,
        "pack",
        &src,
        "--to",
        &packed,
        "--recipient",
        &keys.core_pub,
        "--sign",
        &keys.edge_key,
        "-q"
    ]);
    let mut levels = Vec::new();
    for object in objects(&packed) {
        let manifest = manifest_json(&keys, &object);
        for part in manifest["parts"].as_array().unwrap() {
            let level = part["level"].as_i64().unwrap();
            assert!(
                (1..=9).contains(&level),
                "level {level} outside auto's bounds"
            );
            levels.push(level);
        }
    }
    // Whether the level moves depends on timing; the decisions themselves are unit-tested in
    // forte-prepare's adapt.rs.
    assert_eq!(levels.len(), 18, "every part records its level");
    let out = tmp.path().join("out");
    ok(&unpack_args(&keys, &packed, &out));
    assert_eq!(tree(&out), tree(&src));
    // A usage error, as clap reports them: exit code 2.
    let out = run(&args![
        "pack",
        &src,
        "--to",
        tmp.path().join("o"),
        "--level",
        "fastest"
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"fastest\" is not a zstd level"), "{err}");
}

/// `forte bench compress` sweeps zstd, the only codec forte compresses with: every level, the
/// front, the level to use and the chart; gzip, lz4 and bzip2 are `forte-bench compress`'s.
#[test]
fn bench_compress_sweeps_the_zstd_levels_recommends_one_and_draws_the_chart() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("data/a.log"), &sample_bytes(1_500_000, 1));
    write(&dir.path().join("data/sub/b.bin"), &random_bytes(500_000));
    let out = ok(&args![
        "bench",
        "compress",
        dir.path().join("data"),
        "--sample-size",
        "1MiB",
        "--part-size",
        "256KiB",
        "--link",
        "10MB",
        "--plot",
        dir.path().join("chart")
    ]);
    for row in [
        "| zstd -5 |",
        "| zstd -1 |",
        "| zstd 1 |",
        "| zstd 3 |",
        "| zstd 22 |",
    ] {
        assert!(out.contains(row), "{row} missing:\n{out}");
    }
    for other in ["| lz4 |", "| gzip", "| bzip2"] {
        assert!(!out.contains(other), "{other} in forte's sweep:\n{out}");
    }
    assert!(out.contains("●"), "no Pareto front:\n{out}");
    assert!(out.contains("recommended: zstd "), "{out}");
    assert!(out.contains("`--level "), "{out}");
    let png = std::fs::read(dir.path().join("chart/compress.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let err = fails(&args!["bench", "compress", dir.path().join("missing")]);
    assert!(err.contains("missing"), "{err}");
    // The developers' measurements left the binary for forte-bench.
    let help = ok(&args!["bench", "--help"]);
    assert!(help.contains("compress"), "{help}");
    for gone in ["ingest", "claims"] {
        assert!(!help.contains(gone), "{gone}: {help}");
    }
}

/// A catalogue that cannot be used fails at once with one line that names it and says what
/// to do, and no raw library log: a file that is not a database, a directory that does not
/// exist (never created: a typo must not become a new, empty catalogue), a server that does
/// not answer, and (with PostgreSQL) wrong credentials.
#[test]
fn an_unusable_catalogue_fails_at_once_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_db = dir.path().join("notes.txt");
    write(
        &not_a_db,
        b"not a database at all, but long enough to be read as a header\n",
    );
    let missing = dir.path().join("typo/catalog.sqlite");
    let refused = format!("postgres://forte:x@{}/forte", free_port_addr());
    let mut cases = vec![
        (
            not_a_db.display().to_string(),
            "it is not a SQLite database",
        ),
        // A lookup never makes a catalogue: a mistyped path is named, nothing is created.
        (missing.display().to_string(), "no catalogue at"),
        (refused, "nothing answers there"),
        (String::new(), "--catalog is empty"),
    ];
    match std::env::var("FORTE_TEST_POSTGRES") {
        Ok(url) => {
            let (_, rest) = url.split_once('@').unwrap();
            cases.push((
                format!("postgres://forte:wrong-password@{rest}"),
                "refused the user or password",
            ));
        }
        Err(_) if std::env::var("CI").is_ok() => {
            panic!("FORTE_TEST_POSTGRES is not set: CI must run the PostgreSQL tests")
        }
        Err(_) => eprintln!("SKIPPED (wrong credentials only): set FORTE_TEST_POSTGRES"),
    }
    for (catalog, says) in cases {
        let started = std::time::Instant::now();
        let stderr = fails(&args!["--catalog", &catalog, "status"]);
        let took = started.elapsed();
        assert!(stderr.contains(says), "{catalog}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{catalog}: {stderr}");
        assert!(!stderr.contains("sqlx"), "{catalog}: {stderr}");
        assert!(
            took < std::time::Duration::from_secs(10),
            "{catalog}: {took:?}"
        );
    }
    assert!(
        !missing.parent().unwrap().exists(),
        "the mistyped directory was created"
    );
}

/// A numeric setting of 0 is refused when read, not silently taken as 1.
#[test]
fn a_cpu_budget_of_zero_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let stderr = fails(&args![
        "pack",
        dir.path(),
        "--to",
        dir.path().join("out"),
        "--recipient",
        "core.pub",
        "--sign",
        "edge.key",
        "--cpu",
        "0"
    ]);
    assert!(
        stderr.contains("--cpu (prepare.cpu) is 0: give 1 or more"),
        "{stderr}"
    );
}

/// Every count and timeout that cannot be 0 is refused by name when it is read, from a flag or
/// from the configuration file, before anything starts.
#[test]
fn counts_and_timeouts_of_zero_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["relay", "--max-connections", "0"], "--max-connections"),
        (
            &["relay", "--max-connections-per-address", "0"],
            "--max-connections-per-address",
        ),
        (
            &["relay", "--handshake-timeout", "0s"],
            "--handshake-timeout",
        ),
        (&["relay", "--idle-timeout", "0"], "--idle-timeout"),
        (&["relay", "--quota-per-site", "0"], "--quota-per-site"),
        (
            &["relay", "--expire-open-after", "0s"],
            "--expire-open-after",
        ),
        (&["pull", "--connections", "0"], "--connections"),
        (&["pull", "--interval", "0"], "--interval"),
        (&["send", "--timeout", "0"], "--timeout"),
        (&["ingest", "--rows-per-group", "0"], "--rows-per-group"),
        (
            &["ingest", "--row-groups-per-file", "0"],
            "--row-groups-per-file",
        ),
        (&["ingest", "--flush-after", "0s"], "--flush-after"),
        (&["ingest", "--writers", "0"], "--writers"),
    ];
    for (given, named) in cases {
        let out = forte()
            .args(*given)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{given:?}: {stderr}");
        assert!(
            stderr.contains(named) && (stderr.contains("0") || stderr.contains("zero")),
            "{given:?}: {stderr}"
        );
    }
    // The same from the configuration file.
    let config = dir.path().join("forte.toml");
    std::fs::write(
        &config,
        "[ingest]\nschema = \"rows.toml\"\nout = \"out\"\nrows_per_group = 0\n",
    )
    .unwrap();
    let stderr = fails(&args![
        "--config",
        &config,
        "ingest",
        "--listen",
        free_port_addr()
    ]);
    assert!(
        stderr.contains("ingest.rows_per_group = \"0\": invalid value '0'")
            && stderr.contains("give 1 or more"),
        "{stderr}"
    );
}

/// A SQLite catalogue made immutable (`chattr +i`) is refused at open with one line naming it
/// and the fix, not answered read-only until the first write.
#[test]
fn an_immutable_catalogue_fails_at_once_with_one_clear_line() {
    if !crate::common::machine::may_use_the_machine("chattr +i") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.sqlite");
    // An empty file is an empty SQLite database, which status opens (and migrates).
    write(&catalog, b"");
    ok(&args!["--catalog", &catalog, "status"]);
    let chattr = |flag: &str| {
        let done = std::process::Command::new("chattr")
            .arg(flag)
            .arg(&catalog)
            .status()
            .unwrap();
        assert!(done.success(), "chattr {flag}");
    };
    chattr("+i");
    let out = run(&args!["--catalog", &catalog, "status"]);
    chattr("-i");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let says = format!(
        "cannot open the catalogue sqlite://{}?mode=rwc: {} cannot be written (Operation not permitted",
        catalog.display(),
        catalog.display()
    );
    assert!(stderr.contains(&says), "{stderr}");
    assert!(stderr.contains("chattr -i"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

/// Absurd thread counts are refused by name when read, not tried (a hundred million download
/// threads aborted the process).
#[test]
fn absurd_thread_counts_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = forte()
        .args(["pull", "--connections", "100000000"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--connections") && stderr.contains("more than the 1024"),
        "{stderr}"
    );
    let stderr = fails(&args![
        "pack",
        dir.path(),
        "--to",
        dir.path().join("out"),
        "--recipient",
        "core.pub",
        "--sign",
        "edge.key",
        "--cpu",
        "100000000"
    ]);
    assert!(
        stderr.contains("--cpu (prepare.cpu) is 100000000: give at most 1024"),
        "{stderr}"
    );
}

/// An address nothing listens on.
fn free_port_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}
