//! Who runs the computing stages (`--scheduler`): every scheduler gives the same archive and
//! tree back, Ordo's pool loses nothing when its workers are killed on a schedule, and each
//! run reports its items' latency.

use crate::common::*;

const MIB: usize = 1 << 20;

/// 24 files of 1–3 MiB (compressible and not) and 200 small ones, in parts of 256 KiB.
fn source(root: &std::path::Path) {
    for i in 0..24u64 {
        let len = (1 + i as usize % 3) * MIB + i as usize * 4099;
        let bytes = if i % 2 == 0 {
            sample_bytes(len, i)
        } else {
            random_bytes(len as u64)
        };
        write(&root.join(format!("big/{i:02}.bin")), &bytes);
    }
    for i in 0..200u64 {
        write(
            &root.join(format!("small/{i:03}.txt")),
            format!("reading {i}\n").repeat(1 + i as usize).as_bytes(),
        );
    }
}

/// `pack` in parts of 256 KiB on 2 workers, with `extra` flags and environment; its `--json`.
fn pack_json(
    keys: &Keys,
    src: &std::path::Path,
    to: &std::path::Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> serde_json::Value {
    let mut args = pack_args(keys, src, to);
    args.extend(args!["--part-size", "256KiB", "--cpu", "2", "--json"]);
    args.extend(extra.iter().map(Into::into));
    let out = forte()
        .args(&args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    crate::common::strict_json(std::str::from_utf8(&out.stdout).unwrap())
}

#[test]
fn every_scheduler_packs_and_unpacks_the_same_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    source(&src);
    for scheduler in ["ordo", "threads", "rayon"] {
        let packed = tmp.path().join(format!("packed-{scheduler}"));
        let summary = pack_json(&keys, &src, &packed, &["--scheduler", scheduler], &[]);
        assert_eq!(summary["scheduler"], scheduler);
        assert_eq!(summary["failed"], 0, "{scheduler}");
        // Every part's latency from read to sink, as percentiles.
        let latency = &summary["latency"];
        assert!(
            latency["items"].as_u64().unwrap() >= 24 * 4,
            "{scheduler}: {latency}"
        );
        let (p50, p87, p99) = (
            latency["p50_ms"].as_f64().unwrap(),
            latency["p87_ms"].as_f64().unwrap(),
            latency["p99_ms"].as_f64().unwrap(),
        );
        assert!(
            0.0 < p50 && p50 <= p87 && p87 <= p99,
            "{scheduler}: {latency}"
        );
        let restored = tmp.path().join(format!("restored-{scheduler}"));
        let mut unpack = unpack_args(&keys, &packed, &restored);
        unpack.extend(args!["--scheduler", scheduler]);
        ok(&unpack);
        assert_eq!(tree(&src), tree(&restored), "{scheduler}");
    }
}

#[test]
fn pool_workers_killed_on_a_schedule_lose_and_fail_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    source(&src);
    let packed = tmp.path().join("packed");
    // 60 % of the pool every 20 ms: a kill every few parts.
    let kill = [("FORTE_TEST_KILL_WORKERS", "0.6,0.02")];
    let summary = pack_json(&keys, &src, &packed, &[], &kill);
    assert_eq!(summary["failed"], 0);
    assert!(
        summary["workers_replaced"].as_u64().unwrap() > 0,
        "{}",
        summary["workers_replaced"]
    );
    let restored = tmp.path().join("restored");
    let mut args = unpack_args(&keys, &packed, &restored);
    args.push("--json".into());
    args.retain(|a| a != "-q");
    let out = forte().args(&args).envs(kill).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        crate::common::strict_json(std::str::from_utf8(&out.stdout).unwrap());
    assert!(summary["workers_replaced"].as_u64().unwrap() > 0);
    assert_eq!(tree(&src), tree(&restored));
}

#[test]
fn a_wrong_scheduler_or_kill_schedule_is_refused_with_the_choices() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = keygen(&tmp.path().join("keys"));
    let src = tmp.path().join("src");
    write(&src.join("a.txt"), b"a\n");
    let to = tmp.path().join("packed");
    let mut args = pack_args(&keys, &src, &to);
    args.extend(args!["--scheduler", "fifo"]);
    let out = run(&args);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ordo, threads or rayon"), "{stderr}");
    let out = forte()
        .args(args![
            "pack",
            &src,
            "--to",
            &to,
            "--recipient",
            &keys.core_pub,
            "--sign",
            &keys.edge_key
        ])
        .env("FORTE_TEST_KILL_WORKERS", "60%")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("FORTE_TEST_KILL_WORKERS") && stderr.contains("SHARE,SECONDS"),
        "{stderr}"
    );
    assert!(!to.exists(), "nothing was written");
}
