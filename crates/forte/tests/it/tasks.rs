//! A site's own tasks at the core (`[[task]]` at = "core"): verified batches land in the
//! landing zone, the tasks run there, and only a batch they all pass is promoted to the
//! destination; one a task refused goes to quarantine with the reason, the failure hook fires
//! and `forte status` says why. Tasks that hang are killed at their timeout and retried, ones
//! that crash are retried, and a puller killed while they run resumes without delivering a
//! batch twice or losing one.

use std::path::{Path, PathBuf};

use crate::common::site::{
    assert_described, assert_no_staging, free_addr, kill, sample, scrape, signal_and_wait,
    spawn_logged, visible, wait_for, Site,
};
use crate::common::*;

/// The configuration file of a pull whose landing zone and quarantine are beside its
/// destination, with `tasks` (TOML `[[task]]` entries) after it.
fn config_with(site: &Site, tasks: &str) -> PathBuf {
    let config = site.root.join("forte.toml");
    let text = format!("[pull]\nlanding = \"landing\"\nquarantine = \"quarantine\"\n\n{tasks}");
    write(&config, text.as_bytes());
    config
}

/// `forte pull` with the configuration file `config` and the failure hook appending to
/// `hook.log` in the site's root.
fn pull_with(site: &Site, config: &Path) -> Args {
    let hook = format!(
        "echo \"$FORTE_BATCH: $FORTE_ERROR\" >> {}",
        site.root.join("hook.log").display()
    );
    let mut args = args!["--config", config];
    args.extend(site.pull());
    args.extend(args!["--on-failure", hook]);
    args
}

/// Directories (batches) directly under `dir/site-a`.
fn batches_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("site-a"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Recordings from `forte ingest`, one Parquet file per batch, into the site's inbox: `sources`
/// recordings of 3 000 rows (a timestamp and two float32 sensors), each cut into 3 files.
fn ingest_recordings(site: &Site, sources: &[&str]) {
    let dir = site.root.join("recordings");
    write(
        &dir.join("schema.toml"),
        b"timestamp = \"time\"\n[[column]]\nname = \"s\"\ncount = 2\ntype = \"float32\"\n",
    );
    let mut args = args![
        "ingest",
        "--schema",
        dir.join("schema.toml"),
        "--out",
        site.root.join("inbox"),
        "--rows-per-group",
        "500",
        "--row-groups-per-file",
        "2"
    ];
    for (n, source) in sources.iter().enumerate() {
        let mut rows = Vec::new();
        for i in 0..3_000u64 {
            rows.extend_from_slice(&(i * 1_000_000).to_le_bytes());
            for c in 0..2u32 {
                rows.extend_from_slice(
                    &((i as f32).sin() * (c + 1 + n as u32) as f32).to_le_bytes(),
                );
            }
        }
        let file = dir.join(format!("{source}.bin"));
        write(&file, &rows);
        args.extend(args!["--from-file", file]);
    }
    ok(&args);
}

#[test]
fn the_parquet_check_quarantines_exactly_the_batches_with_a_bad_header_and_promotes_the_others() {
    let Some(python) = python_with("pyarrow") else {
        return;
    };
    let site = Site::new();
    ingest_recordings(&site, &["turbine-1", "turbine-2"]);
    // 2 recordings × 3 files: six batches. One file's header is overwritten at the source.
    let inbox = site.root.join("inbox");
    let mut batches: Vec<String> = std::fs::read_dir(&inbox)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with('.'))
        .collect();
    batches.sort();
    assert_eq!(batches.len(), 6, "{batches:?}");
    let bad = &batches[4];
    let bad_file = inbox.join(bad).join(format!("{bad}.parquet"));
    let mut bytes = std::fs::read(&bad_file).unwrap();
    bytes[..4].copy_from_slice(b"JUNK");
    write(&bad_file, &bytes);

    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tasks/parquet_check.py");
    let config = config_with(
        &site,
        &format!(
            "[[task]]\nname = \"parquet-check\"\nat = \"core\"\nper = \"file\"\ncommand = [{:?}, {:?}, \"--columns\", \"time,s00,s01\"]\nconcurrency = 2\n",
            python.display().to_string(),
            example.display().to_string()
        ),
    );
    ok(&site.send(&["-q"]));
    // The quarantined batch fails the pull's exit status; the others are delivered.
    let printed = fails(&pull_with(&site, &config));
    assert!(printed.contains("quarantined in"), "{printed}");

    let good: Vec<&String> = batches.iter().filter(|b| *b != bad).collect();
    assert_eq!(
        batches_in(&site.root.join("dest")),
        good.clone().into_iter().cloned().collect::<Vec<_>>()
    );
    for b in &good {
        let delivered = site
            .root
            .join("dest/site-a")
            .join(b)
            .join(format!("{b}.parquet"));
        assert_eq!(
            std::fs::read(&delivered).unwrap(),
            std::fs::read(inbox.join(b).join(format!("{b}.parquet"))).unwrap(),
            "{b} delivered byte for byte"
        );
    }
    // The bad batch is in quarantine, whole, with why.
    let kept: Vec<PathBuf> = std::fs::read_dir(site.root.join("quarantine/site-a"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let reason = std::fs::read_to_string(kept[0].join("forte-reason.txt")).unwrap();
    assert!(
        reason.contains(&format!("task parquet-check refused {bad}.parquet: exit 1: {bad}.parquet: bad header: starts with b'JUNK', not b'PAR1'")),
        "{reason}"
    );
    assert_eq!(
        std::fs::read(
            kept[0]
                .join("site-a")
                .join(bad)
                .join(format!("{bad}.parquet"))
        )
        .unwrap(),
        bytes,
        "the quarantined file is the one sent"
    );
    // Nothing is left in the landing zone, and the relay may forget every batch.
    assert!(visible(&site.root.join("landing")).is_empty());
    assert!(
        site.relay_objects().is_empty(),
        "{:?}",
        site.relay_objects()
    );
    // The hook heard it, and `forte status` says why.
    let hook = std::fs::read_to_string(site.root.join("hook.log")).unwrap();
    assert!(hook.contains("bad header"), "{hook}");
    let status = site.status(&site.core_catalog, &[]);
    assert!(status.contains("quarantined"), "{status}");
    assert!(status.contains("why: quarantined in"), "{status}");
    assert!(
        status.contains("task  parquet-check  1 tries (1 refused)"),
        "{status}"
    );
    assert_eq!(status.matches("1 tries (1 passed)").count(), 5, "{status}");

    // The report gives each task's share of the batch latency, and its Gantt chart draws it.
    let charts = site.root.join("charts");
    let report = ok(&site.report(args!["--charts", &charts]));
    assert!(
        report.contains("site tasks (at the edge inside t_send"),
        "{report}"
    );
    let rows: Vec<&str> = report
        .lines()
        .filter(|l| l.contains(" parquet-check      core "))
        .collect();
    assert_eq!(rows.len(), 6, "{report}");
    // Delivered batches have a share (a percentage); the quarantined one has none.
    assert_eq!(
        rows.iter().filter(|l| l.ends_with(" %")).count(),
        5,
        "{report}"
    );
    assert!(
        rows.iter()
            .any(|l| l.starts_with(bad.as_str()) && l.ends_with('-')),
        "{report}"
    );
    let timeline = std::fs::read_to_string(charts.join("timeline.svg")).unwrap();
    assert_eq!(timeline.matches("<title>task parquet-check:").count(), 6);
    assert!(timeline.contains(">task parquet-check</text>"));
}

/// Three batches of two small files each into the inbox.
fn three_batches(site: &Site) {
    for b in 0..3 {
        for f in 0..2 {
            let path = site.root.join(format!("inbox/b{b}/f{f}.dat"));
            write(&path, &sample_bytes(20_000, b * 10 + f));
        }
        write(&site.root.join(format!("inbox/b{b}/.ready")), b"");
    }
}

#[test]
fn a_task_that_hangs_is_killed_at_its_timeout_and_retried_and_one_that_crashes_is_retried() {
    let site = Site::new();
    three_batches(&site);
    // b0 hangs every time; b1 crashes once (exit 3), then passes; b2 is killed by a signal
    // every time. Each try leaves a mark, so what ran is counted.
    let marks = site.root.join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let script = format!(
        r#"echo "$FORTE_TRY" >> {marks}/$FORTE_BATCH
case "$FORTE_BATCH" in
  b0) sleep 60 ;;
  b1) [ "$FORTE_TRY" = 1 ] && {{ echo "first try dies"; exit 3; }}; exit 0 ;;
  b2) kill -SEGV $$ ;;
esac"#,
        marks = marks.display()
    );
    let config = config_with(
        &site,
        &format!(
            "[[task]]\nname = \"flaky\"\nat = \"core\"\nper = \"batch\"\ncommand = {script:?}\ntimeout = \"1s\"\nretries = 1\nconcurrency = 1\n"
        ),
    );
    ok(&site.send(&["-q"]));
    let started = std::time::Instant::now();
    let printed = fails(&pull_with(&site, &config));
    // Two tries of one second for b0, not a minute.
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
    let tries = |b: &str| std::fs::read_to_string(marks.join(b)).unwrap_or_default();
    assert_eq!(
        (tries("b0"), tries("b1"), tries("b2")),
        ("1\n2\n".into(), "1\n2\n".into(), "1\n2\n".into())
    );
    assert_eq!(batches_in(&site.root.join("dest")), ["b1"]);
    assert_eq!(batches_in(&site.root.join("quarantine")).len(), 2);
    assert!(
        printed.contains("killed at its timeout of 1 s"),
        "{printed}"
    );
    assert!(
        printed.contains("crashed: killed by signal 11"),
        "{printed}"
    );
    let status = site.status(&site.core_catalog, &[]);
    assert!(status.contains("2 tries (2 timed_out)"), "{status}");
    assert!(status.contains("2 tries (1 passed, 1 crashed)"), "{status}");
    assert!(status.contains("2 tries (2 crashed)"), "{status}");
}

#[test]
fn a_puller_killed_while_its_tasks_run_resumes_without_a_second_delivery_or_a_lost_batch() {
    let site = Site::new();
    three_batches(&site);
    let started = site.root.join("started");
    let script = format!("touch {}; sleep 2", started.display());
    let config = config_with(
        &site,
        &format!(
            "[[task]]\nname = \"slow\"\nat = \"core\"\nper = \"batch\"\ncommand = {script:?}\n"
        ),
    );
    ok(&site.send(&["-q"]));
    let mut pull = pull_with(&site, &config);
    pull.extend(args!["--watch", "--interval", "1"]);
    let mut first = spawn_logged(&pull, &site.root.join("pull-1.log"));
    assert!(wait_for(60, || started.exists()), "the task never started");
    kill(&mut first);
    // Killed with the task running: nothing reached the destination yet.
    assert!(visible(&site.root.join("dest")).is_empty());
    // The second serves its metrics.
    let http = free_addr();
    pull.extend(args!["--http", &http]);
    let mut second = spawn_logged(&pull, &site.root.join("pull-2.log"));
    // Done when every batch is in place and acknowledged (promotion comes first: a batch can
    // be in place while its landing directory is still being removed).
    let all_there = wait_for(120, || {
        batches_in(&site.root.join("dest")).len() == 3 && site.relay_objects().is_empty()
    });
    let log = std::fs::read_to_string(site.root.join("pull-2.log")).unwrap_or_default();
    let metrics = scrape(&http);
    kill(&mut second);
    assert!(all_there, "{log}");
    // Each batch's task passed once in this run, and its time is counted in seconds.
    let metrics = metrics.expect("the puller serves /metrics");
    assert_described(&metrics, &http);
    let tries = [("task", "slow"), ("outcome", "passed")];
    assert_eq!(
        sample(&metrics, "forte_task_tries_total", &tries),
        Some(3.0)
    );
    let busy = sample(
        &metrics,
        "forte_task_busy_seconds_total",
        &[("task", "slow")],
    );
    assert!(busy.is_some_and(|s| s >= 6.0), "{busy:?}");
    for b in 0..3 {
        for f in 0..2 {
            let delivered = site.root.join(format!("dest/site-a/b{b}/f{f}.dat"));
            assert_eq!(
                std::fs::read(delivered).unwrap(),
                sample_bytes(20_000, b * 10 + f)
            );
        }
    }
    let landing = visible(&site.root.join("landing"));
    assert!(landing.is_empty(), "{landing:?}");
    assert!(site.relay_objects().is_empty());
    // Each file was delivered once: one `delivered` event in its lineage.
    let core = &site.core_catalog;
    for b in 0..3 {
        let lineage = site.status(core, &["--file", &format!("site-a/b{b}/f0.dat")]);
        let delivered = lineage
            .lines()
            .filter(|l| {
                l.split("  ")
                    .nth(2)
                    .is_some_and(|s| s.starts_with("delivered"))
            })
            .count();
        assert_eq!(delivered, 1, "{lineage}");
    }
}

#[test]
fn an_edge_task_keeps_a_refused_batch_at_the_source_until_its_marker_is_touched() {
    let site = Site::new();
    three_batches(&site);
    let allowed = site.root.join("allowed");
    // Refuses b1's second file until `allowed` exists.
    let script = format!(
        r#"[ "$FORTE_BATCH/$FORTE_PATH" != b1/f1.dat ] || [ -e {} ] || {{ echo "$FORTE_PATH: not cleared for sending"; exit 1; }}"#,
        allowed.display()
    );
    let config = config_with(
        &site,
        &format!("[[task]]\nname = \"clearance\"\nat = \"edge\"\ncommand = {script:?}\n"),
    );
    let mut send = args!["--config", &config];
    send.extend(site.send(&[]));
    let refused = |out: &std::process::Output| {
        let printed = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(1), "{printed}");
        assert!(
            printed.contains("batch b1: refused by a site task, not sent"),
            "{printed}"
        );
    };
    let first = run(&send);
    refused(&first);
    let logged = String::from_utf8_lossy(&first.stderr);
    assert!(
        logged.contains(
            "not sent: task clearance refused f1.dat: exit 1: f1.dat: not cleared for sending"
        ),
        "{logged}"
    );
    ok(&site.pull());
    assert_eq!(batches_in(&site.root.join("dest")), ["b0", "b2"]);
    let status = site.status(&site.edge_catalog, &[]);
    assert!(status.contains("refused"), "{status}");
    assert!(
        status.contains("task clearance refused f1.dat: exit 1: f1.dat: not cleared for sending"),
        "{status}"
    );
    // Run again, it stays, and the check is not run again on the same data.
    refused(&run(&send));
    assert!(site.relay_objects().is_empty());
    let status = site.status(&site.edge_catalog, &[]);
    assert!(
        status.contains("task  clearance      2 tries (1 passed, 1 refused)"),
        "{status}"
    );
    // Cleared, and its marker touched: checked again, sent, delivered.
    write(&allowed, b"");
    std::thread::sleep(std::time::Duration::from_millis(20));
    write(&site.root.join("inbox/b1/.ready"), b"");
    ok(&send);
    ok(&site.pull());
    assert_eq!(batches_in(&site.root.join("dest")), ["b0", "b1", "b2"]);
}

#[test]
fn a_task_that_cannot_run_or_has_nowhere_to_quarantine_fails_the_pull_at_once() {
    let site = Site::new();
    three_batches(&site);
    ok(&site.send(&["-q"]));
    let task = "[[task]]\nname = \"check\"\nat = \"core\"\ncommand = [\"./no-such-check\"]\n";
    let config = config_with(&site, task);
    let stderr = fails(&pull_with(&site, &config));
    assert!(
        stderr.contains("[[task]] check: its command ./no-such-check is not an executable file"),
        "{stderr}"
    );
    // Nothing was taken from the relay.
    assert!(!site.root.join("dest").exists());
    assert_eq!(site.relay_objects().len(), 6);
    // A bucket destination's scratch directory is no quarantine: one must be given.
    let config = site.root.join("bucket.toml");
    write(
        &config,
        b"[[task]]\nname = \"check\"\nat = \"core\"\ncommand = [\"true\"]\n",
    );
    let mut pull = args!["--config", &config];
    pull.extend(site.pull());
    let to = pull.iter().position(|a| a == "--to").unwrap() + 1;
    pull[to] = "s3://forte-bucket/dest".into();
    let stderr = fails(&pull);
    assert!(
        stderr.contains("give --quarantine DIR or pull.quarantine"),
        "{stderr}"
    );
}

/// A core task that passes but changes its batch (appends to a file, deletes one, adds a file
/// and a symlink to /etc/passwd, or rewrites a file with its size and mtime kept) gets the
/// batch quarantined with what it changed, never promoted; a task that only reads its batch
/// has it promoted, with the files' modes as sent.
#[test]
fn a_task_that_changes_its_batch_gets_it_quarantined_not_promoted() {
    let site = Site::new();
    three_batches(&site);
    let script = r#"cd "$FORTE_BATCH_DIR" || exit 3
f0=$(find . -name f0.dat); f1=$(find . -name f1.dat); d=$(dirname "$f0")
case "$FORTE_BATCH" in
  b0) chmod u+w "$f0" "$d"; echo extra >> "$f0"; rm -f "$f1"; echo new > "$d/new.txt"
      ln -s /etc/passwd "$d/passwd" ;;
  b1) cat "$f0" "$f1" > /dev/null; [ -w "$f0" ] && [ "$(id -u)" != 0 ] && exit 4 ;;
  b2) chmod u+w "$f0"; m=$(stat -c %y "$f0"); printf X | dd of="$f0" conv=notrunc 2>/dev/null
      touch -d "$m" "$f0" ;;
esac
exit 0"#;
    let config = config_with(
        &site,
        &format!(
            "[[task]]\nname = \"tamper\"\nat = \"core\"\nper = \"batch\"\ncommand = {script:?}\n"
        ),
    );
    ok(&site.send(&["-q"]));
    let printed = fails(&pull_with(&site, &config));
    assert_eq!(batches_in(&site.root.join("dest")), ["b1"], "{printed}");
    assert_eq!(
        batches_in(&site.root.join("quarantine")).len(),
        2,
        "{printed}"
    );
    for change in [
        "task tamper changed the batch: ",
        "changed site-a/b0/f0.dat (20006 bytes, verified 20000)",
        "removed site-a/b0/f1.dat",
        "added site-a/b0/new.txt",
        "added a symlink site-a/b0/passwd",
        "changed site-a/b2/f0.dat (its bytes differ from the verified SHA-256)",
    ] {
        assert!(printed.contains(change), "{change:?} not in:\n{printed}");
    }
    let promoted = site.root.join("dest/site-a/b1/f0.dat");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&promoted).unwrap().permissions(),
    );
    assert_eq!(mode & 0o200, 0o200, "promoted writable as sent: {mode:o}");
    let status = site.status(&site.core_catalog, &[]);
    assert!(status.contains("task tamper changed the batch"), "{status}");
}

/// A task that rewrites `FORTE_FILES` misleads only itself: each task gets the list afresh,
/// so a later task still checks every file.
#[test]
fn a_task_cannot_hide_files_from_the_tasks_after_it() {
    let site = Site::new();
    write(&site.root.join("inbox/b0/f0.dat"), b"BAD data");
    write(&site.root.join("inbox/b0/f1.dat"), b"good data");
    write(&site.root.join("inbox/b0/.ready"), b"");
    let tasks = r#"[[task]]
name = "blind"
at = "core"
per = "batch"
command = ": > \"$FORTE_FILES\""

[[task]]
name = "check"
at = "core"
per = "batch"
command = "if xargs -0 -r grep -l '^BAD' < \"$FORTE_FILES\" | grep -q .; then echo bad; exit 1; fi"
"#;
    let config = config_with(&site, tasks);
    ok(&site.send(&["-q"]));
    let printed = fails(&pull_with(&site, &config));
    assert!(batches_in(&site.root.join("dest")).is_empty(), "{printed}");
    assert!(
        printed.contains("task check refused the batch"),
        "{printed}"
    );
}

/// A quarantined batch whose acknowledgement did not reach the relay is acknowledged again by
/// the next pull, and stays recorded as quarantined under its name (it was recorded as a
/// delivered batch named by its key: found by the soak).
#[test]
fn a_quarantined_batch_acknowledged_again_stays_quarantined_in_the_catalogue() {
    let site = Site::new();
    write(&site.root.join("inbox/b0/f0.dat"), b"data");
    write(&site.root.join("inbox/b0/.ready"), b"");
    let script = r#"d=$(dirname "$(find "$FORTE_BATCH_DIR" -name f0.dat)"); chmod u+w "$d"; echo new > "$d/new.txt""#;
    let config = config_with(
        &site,
        &format!(
            "[[task]]\nname = \"tamper\"\nat = \"core\"\nper = \"batch\"\ncommand = {script:?}\n"
        ),
    );
    ok(&site.send(&["-q"]));
    // The relay cannot keep the batch's receipt, so refuses its acknowledgement before it
    // changes anything: a file where the receipts' directory goes.
    let acked = site.relay.store.join("sites/site-a/receipts");
    write(&acked, b"in the way");
    let printed = fails(&pull_with(&site, &config));
    assert!(printed.contains("quarantined, but"), "{printed}");
    std::fs::remove_file(&acked).unwrap();
    let again = ok(&pull_with(&site, &config));
    assert!(again.contains("acknowledged"), "{again}");
    let status = site.status(&site.core_catalog, &[]);
    assert!(
        status.contains("site-a/b0 "),
        "recorded under its name: {status}"
    );
    assert!(status.contains("quarantined"), "{status}");
    assert!(!status.contains("delivered"), "{status}");
}

/// A task that puts files where its batch will be promoted (beside it, or a hard link to bytes
/// it can change later, which promotion would take as already in place) gets the batch
/// quarantined; nothing it put there is delivered.
#[test]
fn what_a_task_puts_where_its_batch_goes_is_not_delivered_with_it() {
    let site = Site::new();
    three_batches(&site);
    let dest = site.root.join("dest");
    let outside = site.root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let script = format!(
        r#"d="{dest}/site-a/$FORTE_BATCH"
case "$FORTE_BATCH" in
  b0) mkdir -p "$d"; echo EVIL > "$d/extra.txt"; ln -s /etc/passwd "$d/passwd" ;;
  b1) mkdir -p "$d"; f=$(find "$FORTE_BATCH_DIR" -name f0.dat); cp "$f" "{outside}/f0.dat"
      ln "{outside}/f0.dat" "$d/f0.dat" ;;
esac
exit 0"#,
        dest = dest.display(),
        outside = outside.display()
    );
    let config = config_with(
        &site,
        &format!(
            "[[task]]\nname = \"plant\"\nat = \"core\"\nper = \"batch\"\ncommand = {script:?}\n"
        ),
    );
    ok(&site.send(&["-q"]));
    let printed = fails(&pull_with(&site, &config));
    assert!(
        printed.contains("put site-a/b0 at the destination"),
        "{printed}"
    );
    assert!(
        printed.contains("put site-a/b1/f0.dat at the destination"),
        "{printed}"
    );
    let status = site.status(&site.core_catalog, &[]);
    assert!(
        status.contains("b2") && status.contains("delivered"),
        "{status}"
    );
    assert_eq!(
        batches_in(&site.root.join("quarantine")).len(),
        2,
        "{printed}"
    );
}

/// A landing zone on another file system than the destination is refused at start (batches
/// are moved from it by renaming): it used to let every batch land and then fail.
#[test]
fn a_landing_zone_on_another_file_system_is_refused_at_start() {
    let site = Site::new();
    let elsewhere = std::path::Path::new("/dev/shm");
    let dev =
        |p: &std::path::Path| std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(p).unwrap());
    std::fs::create_dir_all(site.root.join("dest")).unwrap();
    assert_ne!(
        dev(elsewhere),
        dev(&site.root.join("dest")),
        "this test needs /dev/shm on another file system than the temporary directory"
    );
    let landing = elsewhere.join(format!("forte-landing-{}", std::process::id()));
    let config = site.root.join("forte.toml");
    write(
        &config,
        format!(
            "[pull]\nlanding = \"{}\"\n\n[[task]]\nname = \"check\"\nat = \"core\"\ncommand = [\"true\"]\n",
            landing.display()
        )
        .as_bytes(),
    );
    let stderr = fails(&pull_with(&site, &config));
    let _ = std::fs::remove_dir_all(&landing);
    assert!(
        stderr.contains("--landing (pull.landing)") && stderr.contains("another file system"),
        "{stderr}"
    );
}

/// A quarantined batch is acknowledged with a receipt, under which the edge deletes its
/// sources: only those of files the quarantine still holds as verified. A file a task changed
/// or removed is kept at the edge (the quarantine has other bytes, and the relay forgets the
/// batch), the others are deleted.
#[test]
fn the_sources_of_files_a_task_changed_are_kept_at_the_edge() {
    let site = Site::new();
    three_batches(&site);
    let outside = site.root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let script = format!(
        r#"cd "$FORTE_BATCH_DIR" || exit 3
f0=$(find . -name f0.dat); f1=$(find . -name f1.dat); d=$(dirname "$f0")
if [ "$FORTE_BATCH" = b0 ]; then chmod u+w "$f0" "$d"; echo extra >> "$f0"; rm -f "$f1"; fi
if [ "$FORTE_BATCH" = b2 ]; then chmod u+w "$d"; echo new > "$d/new.txt"; ln "$f1" "{}/f1.dat"; fi
exit 0"#,
        outside.display()
    );
    let config = config_with(
        &site,
        &format!(
            "[[task]]\nname = \"tamper\"\nat = \"core\"\nper = \"batch\"\ncommand = {script:?}\n"
        ),
    );
    ok(&site.send(&["-q"]));
    fails(&pull_with(&site, &config));
    assert_eq!(batches_in(&site.root.join("dest")), ["b1"]);
    let inbox = site.root.join("inbox");
    let log = site.root.join("send.log");
    let mut sender = spawn_logged(
        &site.send(&["--watch", "--interval", "1", "--delete-after-ack"]),
        &log,
    );
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    // A pass goes through the sent batches in the order they were sent: once b2's f0 is
    // gone, b0 was looked at.
    assert!(
        wait_for(30, || !inbox.join("b1").exists()
            && !inbox.join("b2/f0.dat").exists()),
        "the delivered batch and the unchanged quarantined one are deleted: {}",
        said()
    );
    kill(&mut sender);
    let left = |b: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(inbox.join(b))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n != ".ready")
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    assert_eq!(
        left("b0"),
        ["f0.dat", "f1.dat"],
        "changed and removed: kept"
    );
    assert!(left("b1").is_empty(), "delivered: deleted");
    assert_eq!(
        left("b2"),
        ["f1.dat"],
        "quarantined: f0 unchanged, deleted; f1 linked to another name by the task, kept"
    );
    let b0 = sample_bytes(20_000, 0);
    assert!(std::fs::read(inbox.join("b0/f0.dat")).unwrap() == b0);
}

/// A core task running as root that gives a landed file to another owner, hard-links it to a
/// name outside the batch (through which it could be rewritten once promoted) or sets an
/// extended attribute on it gets its batch quarantined, the reason naming the task and the
/// file; none is promoted.
#[test]
fn a_root_task_that_chowns_hard_links_or_sets_an_xattr_on_a_landed_file_gets_it_quarantined() {
    if !crate::common::machine::may_use_the_machine("a task that chowns a landed file") {
        return;
    }
    let site = Site::new();
    three_batches(&site);
    let outside = site.root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let script = format!(
        r#"f0=$(find "$FORTE_BATCH_DIR" -name f0.dat)
case "$FORTE_BATCH" in
  b0) chown 65534:65534 "$f0" ;;
  b1) ln "$f0" {outside}/link ;;
  b2) python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.note", b"x")' "$f0" ;;
esac"#,
        outside = outside.display()
    );
    let config = config_with(
        &site,
        &format!(
            "[[task]]\nname = \"root\"\nat = \"core\"\nper = \"batch\"\ncommand = {script:?}\n"
        ),
    );
    ok(&site.send(&["-q"]));
    let printed = fails(&pull_with(&site, &config));
    assert!(batches_in(&site.root.join("dest")).is_empty(), "{printed}");
    assert_eq!(
        batches_in(&site.root.join("quarantine")).len(),
        3,
        "{printed}"
    );
    for change in [
        "task root changed the batch: changed site-a/b0/f0.dat (owner 65534:65534, landed 0:0)",
        "task root changed the batch: changed site-a/b1/f0.dat (hard-linked: 2 links, landed with 1)",
        "task root changed the batch: changed site-a/b2/f0.dat (extended attribute user.note set)",
    ] {
        assert!(printed.contains(change), "{change:?} not in:\n{printed}");
    }
}

/// Processes whose command line holds `marker` (a number no other process uses).
fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline
                .contains(marker)
                .then(|| format!("{}: {cmdline}", e.file_name().to_string_lossy()))
        })
        .collect()
}

/// A task that leaves a background job and a detached (`setsid`) one holding its output pipe
/// ends when its first process does: the pull does not wait for them, and nothing of the
/// task is left running after it.
#[test]
fn nothing_a_task_starts_outlives_its_try() {
    let site = Site::new();
    three_batches(&site);
    let script = "sleep 1001.25 & setsid sleep 1001.75 & echo started; exit 0";
    let config = config_with(
        &site,
        &format!("[[task]]\nname = \"leaves\"\nat = \"core\"\nper = \"batch\"\ncommand = {script:?}\ntimeout = \"3s\"\n"),
    );
    ok(&site.send(&["-q"]));
    let started = std::time::Instant::now();
    ok(&pull_with(&site, &config));
    assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
    assert_eq!(batches_in(&site.root.join("dest")).len(), 3);
    assert!(
        wait_for(10, || processes_with("1001.").is_empty()),
        "left running: {:?}",
        processes_with("1001.")
    );
}

/// A puller killed with `kill -9` while its task runs takes the task with it, and what the
/// task started, detached or not.
#[test]
fn a_task_dies_with_its_puller_whatever_kills_it() {
    let site = Site::new();
    three_batches(&site);
    let script = "setsid sleep 1002.75 & sleep 1002.25";
    let config = config_with(
        &site,
        &format!("[[task]]\nname = \"long\"\nat = \"core\"\nper = \"batch\"\ncommand = {script:?}\ntimeout = \"10m\"\n"),
    );
    ok(&site.send(&["-q"]));
    let mut puller = spawn_logged(&pull_with(&site, &config), &site.root.join("pull.log"));
    assert!(
        wait_for(60, || processes_with("1002.").len() >= 2),
        "the task never started: {:?}",
        processes_with("1002.")
    );
    kill(&mut puller);
    assert!(
        wait_for(10, || processes_with("1002.").is_empty()),
        "outlived the puller: {:?}",
        processes_with("1002.")
    );
}

/// Mount points under `dir` in this process's mount namespace, as /proc/self/mountinfo lists
/// them (its fifth field).
fn mounts_under(dir: &Path) -> Vec<String> {
    let under = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(&under))
        .map(str::to_owned)
        .collect()
}

/// A core task running as root bind-mounts a copy of a landed file it controls (same bytes,
/// owner and mode) over it and exits 0: the mount goes with the task's try, so what is promoted
/// is the verified file, and a later rewrite of the task's copy does not reach the delivered
/// one; no mount is left under the site's directory.
#[test]
fn a_mount_a_task_makes_over_its_batch_goes_with_its_try() {
    if !crate::common::machine::may_use_the_machine("a task that mounts") {
        return;
    }
    let site = Site::new();
    let batch = site.root.join("inbox/b0");
    write(&batch.join("f0.dat"), &sample_bytes(20_000, 3));
    write(&batch.join(".ready"), b"");
    let copy = site.root.join("copy.dat");
    let script = format!(
        r#"cp -p "$FORTE_FILE" {copy} && mount --bind {copy} "$FORTE_FILE""#,
        copy = copy.display()
    );
    let config = config_with(
        &site,
        &format!("[[task]]\nname = \"mounts\"\nat = \"core\"\ncommand = {script:?}\n"),
    );
    ok(&site.send(&["-q"]));
    let pulled = run(&pull_with(&site, &config));
    // The task's copy rewritten after the pull, as its owner could do at any time.
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    write(&copy, &vec![b'X'; 20_000]);
    let delivered = std::fs::read(site.root.join("dest/site-a/b0/f0.dat"));
    let mounts = mounts_under(&site.root);
    // Whatever the outcome, nothing of the test stays mounted on the machine.
    for point in mounts.iter().rev() {
        let _ = std::process::Command::new("umount")
            .args(["-l", point])
            .status();
    }
    assert!(
        pulled.status.success(),
        "{}",
        String::from_utf8_lossy(&pulled.stderr)
    );
    assert!(mounts.is_empty(), "left mounted: {mounts:?}");
    assert_eq!(delivered.unwrap(), sample_bytes(20_000, 3));
}

/// A task's paths are absolute whatever directory `pull` started in (here: `--to dest`, from
/// the site's directory, with the task running in `/`), those in its file list too, and the
/// list holds each name whole, a newline inside one included.
#[test]
fn a_task_gets_absolute_paths_and_a_nul_separated_file_list() {
    let site = Site::new();
    let batch = site.root.join("inbox/odd");
    write(&batch.join("plain.dat"), b"plain\n");
    write(&batch.join("a\n/etc/passwd"), b"a name with a newline\n");
    write(&batch.join(".ready"), b"");
    let seen = site.root.join("seen");
    let script = format!(
        r#"case "$FORTE_BATCH_DIR$FORTE_FILES" in /*) ;; *) exit 1 ;; esac
xargs -0 -n1 sh -c 'test -f "$0" && printf "%s\\0" "$0"' < "$FORTE_FILES" > {seen}"#,
        seen = seen.display()
    );
    let config = config_with(
        &site,
        &format!("[[task]]\nname = \"list\"\nat = \"core\"\nper = \"batch\"\nworkdir = \"/\"\ncommand = {script:?}\n"),
    );
    ok(&site.send(&["-q"]));
    let mut pull = pull_with(&site, &config);
    let to = pull.iter().position(|a| a == "--to").unwrap() + 1;
    pull[to] = "dest".into();
    let out = forte()
        .args(&pull)
        .current_dir(&site.root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = std::fs::read_to_string(&seen).unwrap();
    let mut names: Vec<&str> = listed.split_terminator('\0').collect();
    names.sort();
    // Each in the batch's landing directory, in the landing zone `landing` of the site's root.
    let landing = format!("{}/", site.root.join("landing").display());
    let in_batch: Vec<&str> = names
        .iter()
        .filter(|n| n.starts_with(&landing))
        .filter_map(|n| n.split_once("/site-a/odd/"))
        .map(|(_, name)| name)
        .collect();
    assert_eq!(in_batch, ["a\n/etc/passwd", "plain.dat"], "{names:?}");
    assert_eq!(batches_in(&site.root.join("dest")), ["odd"]);
}

/// An empty command would pass every batch: it is refused when the configuration is read.
#[test]
fn an_empty_task_command_is_refused() {
    let site = Site::new();
    let config = config_with(
        &site,
        "[[task]]\nname = \"none\"\nat = \"core\"\ncommand = \"\"\n",
    );
    let stderr = fails(&pull_with(&site, &config));
    assert!(
        stderr.contains("[[task]] none has an empty command"),
        "{stderr}"
    );
}

/// SIGTERM to a watching puller whose task outlasts its shutdown grace: it ends with status 0
/// once the grace ran out, saying so, and its task goes with it.
#[test]
fn a_puller_stopped_while_its_task_runs_ends_after_its_grace_with_its_task() {
    let site = Site::new();
    three_batches(&site);
    let config = config_with(
        &site,
        "[[task]]\nname = \"long\"\nat = \"core\"\nper = \"batch\"\ncommand = \"sleep 1004.5\"\ntimeout = \"10m\"\n",
    );
    ok(&site.send(&["-q"]));
    let mut pull = pull_with(&site, &config);
    pull.extend(args![
        "--watch",
        "--interval",
        "1",
        "--shutdown-grace",
        "2s"
    ]);
    let log = site.root.join("pull.log");
    let mut puller = spawn_logged(&pull, &log);
    assert!(
        wait_for(60, || !processes_with("1004.5").is_empty()),
        "the task never started"
    );
    let status = signal_and_wait(&mut puller, libc::SIGTERM, 30);
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{said}");
    assert!(said.contains("shutdown grace of 2 s ran out"), "{said}");
    assert!(
        wait_for(10, || processes_with("1004.5").is_empty()),
        "the task outlived its puller"
    );
    assert!(
        visible(&site.root.join("dest")).is_empty(),
        "nothing promoted half-checked"
    );
}

/// A puller stopped by SIGTERM while its core task hangs, its grace running out with the
/// batch in the landing zone, and started again without that task (what an operator does
/// about a hanging task): the batch is delivered, and nothing of the cut-off landing copy, its
/// file list or any staging directory is left in the destination.
#[test]
fn a_landing_copy_cut_off_by_the_shutdown_grace_is_removed_at_the_next_start() {
    let site = Site::new();
    let batch = site.root.join("inbox/b0");
    write(&batch.join("f0.dat"), &sample_bytes(20_000, 7));
    write(&batch.join(".ready"), b"");
    // The default landing zone and quarantine: hidden directories of the destination.
    let config = site.root.join("forte.toml");
    write(
        &config,
        b"[[task]]\nname = \"hangs\"\nat = \"core\"\nper = \"batch\"\ncommand = \"sleep 1006.5\"\n",
    );
    ok(&site.send(&["-q"]));
    let mut watching = pull_with(&site, &config);
    watching.extend(args![
        "--watch",
        "--interval",
        "1",
        "--shutdown-grace",
        "1s"
    ]);
    let log = site.root.join("pull.log");
    let mut puller = spawn_logged(&watching, &log);
    assert!(
        wait_for(60, || !processes_with("1006.5").is_empty()),
        "the task never started"
    );
    let status = signal_and_wait(&mut puller, libc::SIGTERM, 30);
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{said}");
    assert!(said.contains("shutdown grace of 1 s ran out"), "{said}");
    let dest = site.root.join("dest");
    let landing = dest.join(".forte-landing");
    assert!(!tree(&landing).is_empty(), "the batch was landing");
    let out = run(&site.pull());
    let printed = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{printed}");
    assert_eq!(
        std::fs::read(dest.join("site-a/b0/f0.dat")).unwrap(),
        sample_bytes(20_000, 7)
    );
    let left = tree(&landing);
    assert!(left.is_empty(), "left in the landing zone: {left:?}");
    assert!(
        printed.contains("removed what 1 interrupted pulls left in the landing zone"),
        "{printed}"
    );
    assert_no_staging(&dest, "the pull after the cut-off one");
}

/// A second signal (SIGINT after SIGTERM: two of one kind may merge while pending) to a
/// watching puller waiting for its task ends it at once with status 1, and one line says so
/// and what the next start takes up.
#[test]
fn a_second_signal_stops_a_puller_at_once_and_says_what_is_left() {
    let site = Site::new();
    three_batches(&site);
    let config = config_with(
        &site,
        "[[task]]\nname = \"long\"\nat = \"core\"\nper = \"batch\"\ncommand = \"sleep 1007.5\"\n",
    );
    ok(&site.send(&["-q"]));
    let mut pull = pull_with(&site, &config);
    pull.extend(args!["--watch", "--interval", "1"]);
    let log = site.root.join("pull.log");
    let mut puller = spawn_logged(&pull, &log);
    assert!(
        wait_for(60, || !processes_with("1007.5").is_empty()),
        "the task never started"
    );
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(puller.0.id() as i32, libc::SIGTERM) };
    let status = signal_and_wait(&mut puller, libc::SIGINT, 30);
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{said}");
    assert!(
        said.contains("second signal: stopping at once; a batch not yet acknowledged is taken again at the next start (which removes what it staged)\n"),
        "{said}"
    );
}
