//! Filters and dry runs (issue 44): `send` and `pack` take the files rclone would list with
//! the same flags, `--dry-run` changes nothing anywhere, and excluded files are never sent nor
//! deleted.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::common::site::*;
use crate::common::*;

/// rclone, which CI must have (test.sh installs Debian's); elsewhere the test is skipped.
fn rclone() -> Option<Command> {
    match Command::new("rclone").arg("version").output() {
        Ok(out) if out.status.success() => Some(Command::new("rclone")),
        _ if std::env::var_os("CI").is_some() => {
            panic!(
                "rclone is missing: CI must run the filter tests against it (test.sh installs it)"
            )
        }
        _ => {
            eprintln!(
                "SKIPPED: install rclone (apt-get install rclone) to compare filters with it"
            );
            None
        }
    }
}

/// 1 000 files in 5 batches: nested directories, sizes 0 to 3 MiB (some around the bounds the
/// filter sets use), mtimes spread over 20 days (none within an hour of an age bound),
/// .tmp/.csv/.bin/.parquet names, dotfiles and spaces.
fn tree(inbox: &Path) {
    let exts = ["csv", "tmp", "bin", "parquet", "txt"];
    let sizes = [
        0u64,
        1,
        1023,
        1024,
        1025,
        10 * 1024,
        100 * 1024,
        1 << 20,
        (1 << 20) + 1,
        3 << 20,
    ];
    let now = SystemTime::now();
    for i in 0..1000u64 {
        let batch = format!("batch-{}", i % 5);
        let dir = match i % 7 {
            0 => String::new(),
            1 => "sub/".into(),
            2 => "sub/deep/".into(),
            3 => "logs 2024/".into(),
            4 => "a/b/c/".into(),
            5 => ".hidden/".into(),
            _ => "data/".into(),
        };
        let name = match i % 11 {
            0 => format!(".dot{i}.{}", exts[(i / 11) as usize % 5]),
            1 => format!("file {i}.{}", exts[(i / 3) as usize % 5]),
            _ => format!("f{i}.{}", exts[(i / 2) as usize % 5]),
        };
        let path = inbox.join(&batch).join(dir).join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let size = sizes[(i * 7 % 10) as usize] as usize;
        let size = if size > (1 << 20) && i % 3 != 0 {
            size / 50
        } else {
            size
        };
        std::fs::write(&path, vec![(i % 251) as u8; size]).unwrap();
        // Half-hours plus 17 minutes, so no file is within minutes of a whole-hour or day bound.
        let age = Duration::from_secs((i * 7919 % 960) * 1800 + 17 * 60);
        filetime::set_file_mtime(&path, filetime::FileTime::from_system_time(now - age)).unwrap();
    }
    for b in 0..5 {
        std::fs::write(inbox.join(format!("batch-{b}/.ready")), b"").unwrap();
    }
}

/// The files forte's dry-run JSON names as taken (send: per batch; pack: one list).
fn taken(json: &str) -> BTreeSet<String> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    let files = |plan: &serde_json::Value| -> Vec<String> {
        plan["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap().to_string())
            .collect()
    };
    match v.get("batches") {
        Some(batches) => batches.as_array().unwrap().iter().flat_map(files).collect(),
        None => files(&v).into_iter().collect(),
    }
}

fn rclone_lists(dir: &Path, flags: &[String]) -> BTreeSet<String> {
    let out = rclone()
        .unwrap()
        .args(["lsf", "-R", "--files-only", "--config", "/dev/null"])
        .args(flags)
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rclone {flags:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn filters_agree_with_rclone() {
    if rclone().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let inbox = tmp.path().join("inbox");
    tree(&inbox);
    let rules = tmp.path().join("rules.txt");
    std::fs::write(&rules, "# keep data, drop temporary files\n- *.tmp\n+ /batch-1/**\n- .*\n!\n- **/.*\n+ *.{csv,parquet}\n- *\n").unwrap();
    let rules2 = tmp.path().join("rules2.txt");
    std::fs::write(&rules2, "- /batch-3/\n+ sub/**\n+ f[0-4]*.bin\n- **\n").unwrap();
    let r = |p: &Path| p.display().to_string();
    let sets: Vec<Vec<String>> = vec![
        vec!["--exclude".into(), "*.tmp".into()],
        vec![
            "--include".into(),
            "*.csv".into(),
            "--include".into(),
            "*.parquet".into(),
        ],
        vec![
            "--exclude".into(),
            "/batch-2/**".into(),
            "--exclude".into(),
            ".*".into(),
        ],
        vec!["--filter-from".into(), r(&rules)],
        vec!["--filter-from".into(), r(&rules2)],
        vec!["--include".into(), "**/sub/**.{csv,bin}".into()],
        vec![
            "--exclude".into(),
            "[a-c]/**".into(),
            "--exclude".into(),
            "file ?[0-9]*".into(),
        ],
        vec![
            "--min-size".into(),
            "1".into(),
            "--max-size".into(),
            "1M".into(),
        ],
        vec![
            "--max-age".into(),
            "3d".into(),
            "--min-age".into(),
            "10h".into(),
            "--exclude".into(),
            "*.bin".into(),
        ],
        vec![
            "--min-size".into(),
            "1025B".into(),
            "--max-age".into(),
            "1w".into(),
            "--include".into(),
            "/batch-[0-2]/**".into(),
        ],
    ];
    let marker = format!("/{}", forte_edge_marker());
    for flags in &sets {
        let mut args = args!["send", &inbox, "--dry-run", "--json"];
        args.extend(flags.iter().map(Into::into));
        let sent = taken(&ok(&args));
        let listed: BTreeSet<String> = rclone_lists(&inbox, flags)
            .into_iter()
            .filter(|p| !p.ends_with(&marker))
            .collect();
        assert!(!listed.is_empty(), "{flags:?} lists something");
        assert_eq!(sent, listed, "send {flags:?}");
        // pack, relative to the packed directory
        let batch = inbox.join("batch-1");
        let mut args = args![
            "pack",
            &batch,
            "--to",
            tmp.path().join("never"),
            "--dry-run",
            "--json"
        ];
        args.extend(flags.iter().map(Into::into));
        // pack packs a tree as it is, a .ready file included: compared without it on both sides.
        let mut packed = taken(&ok(&args));
        packed.remove(forte_edge_marker());
        let listed: BTreeSet<String> = rclone_lists(&batch, flags)
            .into_iter()
            .filter(|p| p != forte_edge_marker())
            .collect();
        assert_eq!(packed, listed, "pack {flags:?}");
        assert!(
            !tmp.path().join("never").exists(),
            "pack --dry-run wrote nothing"
        );
    }
}

fn forte_edge_marker() -> &'static str {
    ".ready"
}

/// SHA-256 over every file under `dir`: its path and its bytes.
fn tree_hash(dir: &Path) -> String {
    let mut h = Sha256::new();
    let mut stack = vec![dir.to_path_buf()];
    let mut files = Vec::new();
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                files.push(e.path());
            }
        }
    }
    files.sort();
    for f in files {
        h.update(f.strip_prefix(dir).unwrap().to_string_lossy().as_bytes());
        h.update(std::fs::read(&f).unwrap_or_default());
    }
    hex::encode(h.finalize())
}

/// A catalogue's files, each by name with its digest or "absent": the database and the
/// `-wal`, `-shm` and `-journal` SQLite may keep beside it.
fn catalogue_hash(path: &str) -> Vec<String> {
    ["", "-wal", "-shm", "-journal"]
        .iter()
        .map(|suffix| {
            let file = format!("{path}{suffix}");
            let digest = std::fs::read(&file).map(|b| hex::encode(Sha256::digest(b)));
            format!("{file}: {}", digest.unwrap_or("absent".into()))
        })
        .collect()
}

/// `first` sent and delivered (the core's receipt at the relay), `later` sent and waiting at
/// the relay, `second` not sent: every dry run says so, and nothing changes, the catalogue
/// files (with any `-wal`/`-shm`) included; then a real send deletes what its dry run said.
#[test]
fn dry_run_changes_nothing() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write_batch(&inbox, "first", 3, 20_000);
    ok(&site.send(&["-q"]));
    ok(&site.pull());
    write_batch(&inbox, "later", 2, 10_000);
    ok(&site.send(&["-q"]));
    write_batch(&inbox, "second", 2, 10_000);
    std::fs::write(inbox.join("second/skip.tmp"), b"temporary").unwrap();
    let dest = site.root.join("dest");
    let state = || {
        let trees = [&inbox, &site.relay.store, &dest].map(|d| vec![tree_hash(d)]);
        let catalogues = [&site.edge_catalog, &site.core_catalog].map(|c| catalogue_hash(c));
        trees.into_iter().chain(catalogues).collect::<Vec<_>>()
    };
    let before = state();
    let sent = ok(&site.send(&["--dry-run", "--exclude", "*.tmp"]));
    assert!(
        sent.contains("second/skip.tmp (excluded by --exclude *.tmp)"),
        "{sent}"
    );
    assert!(
        sent.contains("batch second: would send 2 files") && sent.contains("would send second/"),
        "{sent}"
    );
    assert!(
        sent.contains(
            "batch first: sent before (sent): nothing new to send; 3 sent before (3 acknowledged)"
        ),
        "{sent}"
    );
    assert!(sent.contains("acknowledged first/bags/000.bag"), "{sent}");
    assert!(
        sent.contains(
            "batch later: sent before (sent): nothing new to send; 2 sent before (0 acknowledged)"
        ),
        "{sent}"
    );
    assert!(!sent.contains("would send first/"), "{sent}");
    assert!(!sent.contains("would delete"), "{sent}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&site.send(&["--dry-run", "--json"]))).unwrap();
    let batch = |name: &str| {
        let all = json["batches"].as_array().unwrap();
        all.iter().find(|b| b["batch"] == name).unwrap().clone()
    };
    assert_eq!(batch("first")["action"], "follow_up", "{json}");
    assert_eq!(
        batch("first")["files"][0]["action"],
        "acknowledged",
        "{json}"
    );
    assert_eq!(batch("later")["files"][0]["action"], "sent", "{json}");
    assert_eq!(batch("second")["action"], "send", "{json}");
    assert_eq!(
        batch("second")["files"][0]["action"],
        "would_send",
        "{json}"
    );
    // --delete-after-ack needs --watch; a dry run looks once.
    let watching = ["--watch", "--delete-after-ack", "--exclude", "*.tmp"];
    let deleting = ok(&site.send(&[&["--dry-run"], &watching[..]].concat()));
    assert!(
        deleting.contains(
            "batch first: would delete 3 source files under 1 receipt(s) of the core; 0 kept, 0 waiting"
        ),
        "{deleting}"
    );
    assert!(
        deleting.contains("batch later: would delete 0 source files under 0 receipt(s) of the core; 0 kept, 2 waiting"),
        "{deleting}"
    );
    // No catalogue: nothing sent before, and none made.
    let fresh = site.root.join("fresh/edge.sqlite");
    std::fs::create_dir_all(fresh.parent().unwrap()).unwrap();
    let mut none = site.send(&["--dry-run"]);
    none[1] = fresh.clone().into();
    let said = ok(&none);
    assert!(said.contains("batch first: would send 3 files"), "{said}");
    assert!(
        said.contains("no catalogue: nothing was sent before"),
        "{said}"
    );
    assert_eq!(
        std::fs::read_dir(fresh.parent().unwrap()).unwrap().count(),
        0
    );
    let mut pull = site.pull();
    pull.push("--dry-run".into());
    let pulled = ok(&pull);
    assert!(
        pulled.contains("batch later of site-a: would deliver 2 files"),
        "{pulled}"
    );
    assert!(!pulled.contains("batch first"), "{pulled}");
    assert!(
        pulled.contains(&format!("{}/site-a/later/", dest.display())),
        "{pulled}"
    );
    pull.push("--json".into());
    let json: serde_json::Value = serde_json::from_str(&ok(&pull)).unwrap();
    assert_eq!(json[0]["files"].as_array().unwrap().len(), 2, "{json}");
    let packed = ok(&args![
        "pack",
        inbox.join("second"),
        "--to",
        site.root.join("out"),
        "--dry-run",
        "--exclude",
        "*.tmp"
    ]);
    assert!(packed.contains("excluded   skip.tmp"), "{packed}");
    assert_eq!(
        state(),
        before,
        "inbox, relay store, destination and both catalogues (with -wal, -shm) unchanged"
    );
    assert!(!site.root.join("out").exists());
    // What the dry run said would be deleted is what a real send deletes.
    let mut sender = spawn_logged(&site.send(&watching), &site.root.join("send.log"));
    let gone = wait_for(60, || !inbox.join("first").exists());
    kill(&mut sender);
    assert!(gone, "first's sources deleted");
    assert_eq!(files_under(&inbox.join("later")).len(), 3, "later kept");
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            // forte's own records beside the delivered files: not what a user looks for.
            if [".forte-custody", ".forte-replaced"].contains(&e.file_name().to_str().unwrap_or(""))
            {
                continue;
            }
            match e.file_type().unwrap().is_dir() {
                true => stack.push(e.path()),
                false => found.push(e.path().display().to_string()),
            }
        }
    }
    found
}

/// `pull --dry-run` files a batch by the time it arrived at its edge (its ready marker's
/// time, signed in its manifests), as a real pull does, not by when it was sealed: the paths
/// it prints are the paths the pull then writes.
#[test]
fn pull_dry_run_dates_batches_as_the_pull_does() {
    let site = Site::new();
    let batch = write_batch(&site.root.join("inbox"), "old", 2, 5_000);
    // 2024-03-05 12:00 UTC: the batch arrived then, and is sealed today.
    let arrived = filetime::FileTime::from_unix_time(1_709_640_000, 0);
    filetime::set_file_mtime(batch.join(".ready"), arrived).unwrap();
    ok(&site.send(&["-q"]));
    let layout = ["--layout", "{site}/{yyyy}/{mm}/{dd}/{batch}/{path}"];
    let mut pull = site.pull();
    pull.extend(layout.iter().map(Into::into));
    let mut dry = pull.clone();
    dry.extend(["--dry-run".into(), "--json".into()]);
    let json: serde_json::Value = serde_json::from_str(&ok(&dry)).unwrap();
    let dest = site.root.join("dest");
    let planned: BTreeSet<String> = json[0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["to"].as_str().unwrap().to_string())
        .collect();
    let expected: BTreeSet<String> = ["000", "001"]
        .iter()
        .map(|i| format!("{}/site-a/2024/03/05/old/bags/{i}.bag", dest.display()))
        .collect();
    assert_eq!(planned, expected, "{json}");
    ok(&pull);
    let written: BTreeSet<String> = files_under(&dest).into_iter().collect();
    assert_eq!(written, planned, "the dry run's paths are the pull's");
}

#[test]
fn excluded_files_survive_delete_after_ack_and_status_names_them() {
    let site = Site::new();
    let batch = write_batch(&site.root.join("inbox"), "run", 3, 30_000);
    std::fs::create_dir_all(batch.join("sub")).unwrap();
    std::fs::write(batch.join("partial.tmp"), b"still being written").unwrap();
    std::fs::write(batch.join("sub/other.tmp"), b"also temporary").unwrap();
    std::fs::write(batch.join(".ready"), b"").unwrap();
    ok(&site.send(&["-q", "--exclude", "*.tmp"]));
    ok(&site.pull());
    let delivered = site.root.join("dest/site-a/run");
    assert!(
        !delivered.join("partial.tmp").exists(),
        "an excluded file is never delivered"
    );
    let log = site.root.join("send.log");
    let mut sender = spawn_logged(
        &site.send(&[
            "--watch",
            "--interval",
            "1",
            "--delete-after-ack",
            "--exclude",
            "*.tmp",
        ]),
        &log,
    );
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_for(60, || said().contains("2 excluded file(s) kept")),
        "{}",
        said()
    );
    kill(&mut sender);
    assert_eq!(
        std::fs::read(batch.join("partial.tmp")).unwrap(),
        b"still being written"
    );
    assert_eq!(
        std::fs::read(batch.join("sub/other.tmp")).unwrap(),
        b"also temporary"
    );
    let status = site.status(&site.edge_catalog, &[]);
    assert!(status.contains("excluded: 2 files"), "{status}");
    assert!(
        status.contains("partial.tmp  (excluded by --exclude *.tmp)"),
        "{status}"
    );
}

/// A file sent before the operator excluded it is not deleted either: excluding it says
/// "leave it alone" (found by the outside review: it was deleted under its receipt).
#[test]
fn a_file_excluded_after_it_was_sent_is_kept() {
    let site = Site::new();
    let batch = write_batch(&site.root.join("inbox"), "run", 2, 30_000);
    std::fs::write(batch.join("keep.raw"), b"the operator wants this one kept").unwrap();
    ok(&site.send(&["-q"]));
    ok(&site.pull());
    assert!(site.root.join("dest/site-a/run/keep.raw").exists());
    let log = site.root.join("send.log");
    let args = [
        "--watch",
        "--interval",
        "1",
        "--delete-after-ack",
        "--exclude",
        "*.raw",
    ];
    let mut sender = spawn_logged(&site.send(&args), &log);
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_for(60, || said().contains("1 excluded file(s) kept")),
        "{}",
        said()
    );
    kill(&mut sender);
    assert_eq!(
        std::fs::read(batch.join("keep.raw")).unwrap(),
        b"the operator wants this one kept"
    );
    assert!(
        !batch.join("bags/000.bag").exists(),
        "the sent files not excluded go"
    );
}
