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

#[test]
fn dry_run_changes_nothing() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write_batch(&inbox, "first", 3, 20_000);
    ok(&site.send(&["-q"]));
    write_batch(&inbox, "second", 2, 10_000);
    std::fs::write(inbox.join("second/skip.tmp"), b"temporary").unwrap();
    std::fs::create_dir_all(site.root.join("dest")).unwrap();
    let (edge, core) = (Path::new(&site.edge_catalog), Path::new(&site.core_catalog));
    let state = || {
        [&inbox, &site.relay.store, &site.root.join("dest")]
            .iter()
            .map(|d| tree_hash(d))
            .chain([edge, core].iter().map(|c| {
                std::fs::read(c)
                    .map(|b| hex::encode(Sha256::digest(b)))
                    .unwrap_or("absent".into())
            }))
            .collect::<Vec<_>>()
    };
    let before = state();
    let sent = ok(&site.send(&["--dry-run", "--exclude", "*.tmp"]));
    assert!(
        sent.contains("second/skip.tmp (excluded by --exclude *.tmp)"),
        "{sent}"
    );
    assert!(sent.contains("would send second/"), "{sent}");
    let mut pull = site.pull();
    pull.push("--dry-run".into());
    let pulled = ok(&pull);
    assert!(
        pulled.contains("batch first of site-a: would deliver 3 files"),
        "{pulled}"
    );
    assert!(
        pulled.contains(&format!(
            "{}/site-a/first/",
            site.root.join("dest").display()
        )),
        "{pulled}"
    );
    pull.push("--json".into());
    let json: serde_json::Value = serde_json::from_str(&ok(&pull)).unwrap();
    assert_eq!(json[0]["files"].as_array().unwrap().len(), 3, "{json}");
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
        "inbox, relay store, destination and both catalogues unchanged"
    );
    assert!(!site.root.join("out").exists());
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
