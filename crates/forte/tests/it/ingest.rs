//! `forte ingest` end to end: recordings and TCP streams into Parquet files that stock readers
//! (pyarrow and DuckDB) read back bit for bit, with the encodings the schema asks for; a
//! killed ingest never leaves a damaged file and a restart goes on with new ones.

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::site::{free_addr, kill, spawn_logged, wait_for};
use crate::common::*;

const SCHEMA: &str = r#"
timestamp = "time"
[[column]]
name = "s"
count = 3
type = "float32"
[[column]]
name = "v"
type = "float64"
[[column]]
name = "raw"
type = "float32"
encoding = "plain"
[[column]]
name = "count"
type = "int32"
[[column]]
name = "seq"
type = "int64"
encoding = "delta_binary_packed"
"#;

/// The schema above as readback.py takes it.
const SCHEMA_JSON: &str = r#"{"timestamp": "time", "columns": [["s00", "float32"], ["s01", "float32"], ["s02", "float32"], ["v", "float64"], ["raw", "float32"], ["count", "int32"], ["seq", "int64"]]}"#;

const ROW: usize = 8 + 3 * 4 + 8 + 4 + 4 + 8;

/// Rows with NaN (two payloads), ±inf, -0.0 and subnormals among ordinary values.
fn rows(count: usize, seed: u64) -> Vec<u8> {
    let specials32 = [
        f32::NAN,
        f32::from_bits(0x7fc0_1234),
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        f32::MIN_POSITIVE / 3.0,
    ];
    let specials64 = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        f64::MIN_POSITIVE / 7.0,
    ];
    let mut out = Vec::with_capacity(count * ROW);
    let mut x = seed | 1;
    for r in 0..count {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&(1_795_305_600_000_000_000i64 + r as i64 * 39_063).to_le_bytes());
        for c in 0..3 {
            let v = if (r + c) % 53 == 0 {
                specials32[(r / 53 + c) % specials32.len()]
            } else {
                100.0 + c as f32 + (x % 10_000) as f32 / 3_333.0
            };
            out.extend_from_slice(&v.to_le_bytes());
        }
        let v = if r % 61 == 0 {
            specials64[(r / 61) % specials64.len()]
        } else {
            (x % 1_000_000) as f64 / 7.0
        };
        out.extend_from_slice(&v.to_le_bytes());
        out.extend_from_slice(&((x % 977) as f32).to_le_bytes());
        out.extend_from_slice(&((x % 100_000) as i32 - 50_000).to_le_bytes());
        out.extend_from_slice(&(seed as i64 * 1_000_000 + r as i64).to_le_bytes());
    }
    out
}

/// Published Parquet files of `source` in `outbox`, in the order they were started.
fn files_of(outbox: &Path, source: &str) -> Vec<PathBuf> {
    let mut found: Vec<((String, u64), PathBuf)> = std::fs::read_dir(outbox)
        .unwrap()
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(&format!("{source}-")) && e.path().join(".ready").exists()
        })
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            // SOURCE-STAMP-PID-SEQ: by time, then by the process's counter.
            let mut fields = name.rsplit('-');
            let seq = fields.next().unwrap().parse().unwrap();
            let stamp = fields.nth(1).unwrap().to_string();
            ((stamp, seq), e.path().join(format!("{name}.parquet")))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// The rows of `files` as read by `engine`, in the wire format; with pyarrow also the
/// encodings per column.
fn read_back(python: &Path, engine: &str, files: &[PathBuf], work: &Path) -> (Vec<u8>, String) {
    let out = work.join(format!("readback-{engine}.bin"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/readback.py");
    let printed = stdout_of(
        Command::new(python)
            .arg(script)
            .args([engine, SCHEMA_JSON])
            .arg(&out)
            .args(files),
    );
    (
        std::fs::read(&out).unwrap(),
        String::from_utf8(printed).unwrap(),
    )
}

fn ingest_args(dir: &Path) -> Args {
    write(&dir.join("schema.toml"), SCHEMA.as_bytes());
    args![
        "ingest",
        "--schema",
        dir.join("schema.toml"),
        "--out",
        dir.join("outbox"),
        "--rows-per-group",
        "1000",
        "--row-groups-per-file",
        "3"
    ]
}

#[test]
fn recordings_read_back_bit_for_bit_by_pyarrow_and_duckdb_with_the_chosen_encodings() {
    let Some(python) = python_with("pyarrow, duckdb, numpy") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sent = rows(7_777, 1);
    let mut recording = wire_header("turbine-07");
    recording.extend_from_slice(&sent);
    write(&dir.path().join("rec.bin"), &recording);
    let mut args = ingest_args(dir.path());
    args.extend(args!["--from-file", dir.path().join("rec.bin")]);
    let printed = ok(&args);
    assert!(
        printed.contains("stream turbine-07 ended: 7777 rows") && printed.contains("3 files"),
        "{printed}"
    );
    let files = files_of(&dir.path().join("outbox"), "turbine-07");
    assert_eq!(files.len(), 3, "8 row groups, 3 per file");
    let (by_pyarrow, encodings) = read_back(&python, "pyarrow", &files, dir.path());
    assert!(by_pyarrow == sent, "pyarrow read back other values");
    let (by_duckdb, _) = read_back(&python, "duckdb", &files, dir.path());
    assert!(by_duckdb == sent, "DuckDB read back other values");

    let encodings: serde_json::Value = serde_json::from_str(&encodings).unwrap();
    let of = |c: &str| -> Vec<String> { serde_json::from_value(encodings[c].clone()).unwrap() };
    for c in ["s00", "s01", "s02", "v"] {
        assert!(
            of(c).contains(&"BYTE_STREAM_SPLIT".into()),
            "{c}: {:?}",
            of(c)
        );
    }
    for c in ["time", "seq"] {
        assert!(
            of(c).contains(&"DELTA_BINARY_PACKED".into()),
            "{c}: {:?}",
            of(c)
        );
    }
    for c in ["raw", "count"] {
        assert!(of(c).contains(&"PLAIN".into()), "{c}: {:?}", of(c));
    }
    for (c, e) in encodings.as_object().unwrap() {
        assert!(
            !e.to_string().contains("DICTIONARY"),
            "{c} is dictionary encoded: {e}"
        );
    }
}

fn wire_header(source: &str) -> Vec<u8> {
    format!("FORTE-INGEST 1 {source}\n").into_bytes()
}

/// Sends `rows` on a new stream from `source`, in pieces that cut rows in two.
fn send_stream(addr: &str, source: &str, rows: &[u8]) -> TcpStream {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.write_all(&wire_header(source)).unwrap();
    for piece in rows.chunks(10_007) {
        conn.write_all(piece).unwrap();
    }
    conn
}

/// `forte ingest --listen` on a free port, logging to `log`, once it accepts connections.
fn listening(dir: &Path, log: &str) -> (Args, String, crate::common::site::Daemon) {
    let addr = free_addr();
    let mut args = ingest_args(dir);
    args.extend(args!["--listen", &addr]);
    let ingest = spawn_logged(&args, &dir.join(log));
    assert!(
        wait_for(30, || TcpStream::connect(&addr).is_ok()),
        "ingest did not listen"
    );
    (args, addr, ingest)
}

#[test]
fn concurrent_tcp_streams_each_become_their_own_files() {
    let Some(python) = python_with("pyarrow, duckdb, numpy") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_, addr, _ingest) = listening(dir.path(), "ingest.log");
    let log = dir.path().join("ingest.log");

    let streams: Vec<(String, Vec<u8>)> = (0..3)
        .map(|i| (format!("unit-{i}"), rows(2_500 + i * 1_000, i as u64 + 10)))
        .collect();
    std::thread::scope(|scope| {
        for (source, sent) in &streams {
            scope.spawn(|| drop(send_stream(&addr, source, sent)));
        }
    });
    // A bad first line is refused and logged; the others are not disturbed.
    TcpStream::connect(&addr)
        .unwrap()
        .write_all(b"HELLO ../etc\n")
        .unwrap();
    let outbox = dir.path().join("outbox");
    for (source, sent) in &streams {
        let whole = sent.len() / ROW;
        let expected_files = whole.div_ceil(1000).div_ceil(3);
        assert!(
            wait_for(30, || files_of(&outbox, source).len() == expected_files),
            "{source}: {} files, expected {expected_files}",
            files_of(&outbox, source).len()
        );
        let (back, _) = read_back(&python, "pyarrow", &files_of(&outbox, source), dir.path());
        assert!(back == *sent, "{source}: other values read back");
    }
    assert!(
        wait_for(10, || std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("must start with `FORTE-INGEST 1 SOURCE`")),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

#[test]
fn a_killed_ingest_loses_only_open_row_groups_and_a_restart_goes_on() {
    let Some(python) = python_with("pyarrow, duckdb, numpy") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (args, addr, mut ingest) = listening(dir.path(), "ingest.log");
    let outbox = dir.path().join("outbox");

    // A long stream: kill -9 once two files are out and the third is open.
    let sent = rows(200_000, 3);
    let sender = {
        let (addr, sent) = (addr.clone(), sent.clone());
        std::thread::spawn(move || {
            let mut conn = TcpStream::connect(&addr).unwrap();
            conn.write_all(&wire_header("long")).unwrap();
            for piece in sent.chunks(ROW * 100) {
                if conn.write_all(piece).is_err() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(300));
            }
        })
    };
    assert!(wait_for(60, || files_of(&outbox, "long").len() >= 2));
    kill(&mut ingest);
    sender.join().unwrap();

    // Every published file is whole and holds a prefix of the stream, in order.
    let published = files_of(&outbox, "long");
    let (back, _) = read_back(&python, "pyarrow", &published, dir.path());
    assert!(!back.is_empty() && back.len() % (3 * 1000 * ROW) == 0);
    assert!(
        back == sent[..back.len()],
        "published rows are not the stream's first rows"
    );
    let unfinished: Vec<_> = std::fs::read_dir(outbox.join(".forte-ingest"))
        .unwrap()
        .flatten()
        .collect();
    // The file open at the kill, unless the kill came between two files.
    assert!(unfinished.len() <= 1, "{unfinished:?}");

    // The restart removes the unfinished file, leaves the published ones, and writes new files.
    let log = dir.path().join("ingest2.log");
    let _again = spawn_logged(&args, &log);
    assert!(wait_for(30, || TcpStream::connect(&addr).is_ok()));
    if !unfinished.is_empty() {
        assert!(std::fs::read_to_string(&log)
            .unwrap()
            .contains("removed 1 unfinished files"));
    }
    let more = rows(1_500, 4);
    drop(send_stream(&addr, "long", &more));
    assert!(wait_for(30, || files_of(&outbox, "long").len()
        == published.len() + 1));
    let all = files_of(&outbox, "long");
    assert_eq!(all[..published.len()], published[..]);
    let (newest, _) = read_back(&python, "duckdb", &all[published.len()..], dir.path());
    assert!(newest == more);
}

#[test]
fn the_config_file_sets_what_flags_do_not() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("conf/turbine.toml"), SCHEMA.as_bytes());
    write(
        &dir.path().join("conf/forte.toml"),
        b"[ingest]\nschema = \"turbine.toml\"\nout = \"outbox\"\nrows_per_group = 100\nrow_groups_per_file = 1\ncodec = \"snappy\"\n",
    );
    let recording = dir.path().join("unit-9.bin");
    write(&recording, &rows(250, 9));
    let printed = ok(&args![
        "--config",
        dir.path().join("conf/forte.toml"),
        "ingest",
        "--from-file",
        &recording
    ]);
    assert!(
        printed.contains("250 rows") && printed.contains("3 files"),
        "{printed}"
    );
    assert_eq!(files_of(&dir.path().join("conf/outbox"), "unit-9").len(), 3);
    write(&dir.path().join("bad.toml"), b"[ingest]\ncodec = \"zip\"\n");
    let err = fails(&args![
        "--config",
        dir.path().join("bad.toml"),
        "ingest",
        "--schema",
        dir.path().join("conf/turbine.toml"),
        "--out",
        dir.path().join("o"),
        "--from-file",
        &recording
    ]);
    assert!(
        err.contains("bad.toml is not valid: ingest.codec = \"zip\""),
        "{err}"
    );
}

#[test]
fn bad_schemas_and_missing_settings_say_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("bad.toml");
    write(&schema, b"[[column]]\nname = \"a\"\ntype = \"float16\"\n");
    let err = fails(&args![
        "ingest",
        "--schema",
        &schema,
        "--out",
        dir.path().join("o"),
        "--from-file",
        &schema
    ]);
    assert!(err.contains("bad.toml") && err.contains("float16"), "{err}");
    let err = fails(&args![
        "ingest",
        "--out",
        dir.path().join("o"),
        "--from-file",
        &schema
    ]);
    assert!(err.contains("--schema"), "{err}");
    let good = dir.path().join("good.toml");
    write(&good, SCHEMA.as_bytes());
    let odd = dir.path().join("odd name!.bin");
    write(&odd, &rows(10, 1));
    let err = fails(&args![
        "ingest",
        "--schema",
        &good,
        "--out",
        dir.path().join("o"),
        "--from-file",
        &odd
    ]);
    assert!(err.contains("not a valid source name"), "{err}");
}

#[test]
fn ingested_files_travel_as_batches_through_send_and_pull() {
    let site = crate::common::site::Site::new();
    let inbox = site.root.join("inbox");
    write(&site.root.join("schema.toml"), SCHEMA.as_bytes());
    let recording = site.root.join("rig-3.bin");
    write(&recording, &rows(2_500, 5));
    ok(&args![
        "ingest",
        "--schema",
        site.root.join("schema.toml"),
        "--out",
        &inbox,
        "--rows-per-group",
        "1000",
        "--row-groups-per-file",
        "2",
        "--from-file",
        &recording
    ]);
    let published = files_of(&inbox, "rig-3");
    assert_eq!(published.len(), 2);
    // The ingest's work directory is hidden: send takes only the published batches.
    assert!(inbox.join(".forte-ingest").is_dir());
    ok(&site.send(&["-q"]));
    ok(&site.pull());
    let dest = site.root.join("dest");
    let mut expected = std::collections::BTreeMap::new();
    for file in &published {
        let batch = file
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy();
        let name = file.file_name().unwrap().to_string_lossy();
        expected.insert(
            format!("site-a/{batch}/{name}"),
            crate::common::site::source_hashes(file.parent().unwrap())[&*name].clone(),
        );
    }
    assert_eq!(crate::common::site::visible(&dest), expected);
}

#[test]
fn a_stopped_ingest_publishes_every_row_it_received() {
    let Some(python) = python_with("pyarrow, duckdb, numpy") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_, addr, mut ingest) = listening(dir.path(), "ingest.log");
    // The stream stays open: only the signal ends it, in the middle of a row group.
    let sent = rows(4_321, 6);
    let conn = send_stream(&addr, "stop-me", &sent);
    std::thread::sleep(std::time::Duration::from_secs(1));
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(ingest.0.id() as i32, libc::SIGTERM) };
    let mut status = None;
    assert!(wait_for(30, || {
        status = ingest.0.try_wait().unwrap();
        status.is_some()
    }));
    assert!(status.unwrap().success(), "{:?}", status);
    let files = files_of(&dir.path().join("outbox"), "stop-me");
    let (back, _) = read_back(&python, "pyarrow", &files, dir.path());
    assert!(
        back == sent,
        "{} of {} rows published",
        back.len() / ROW,
        sent.len() / ROW
    );
    drop(conn);
}

#[test]
fn streams_beyond_the_limit_are_refused_and_the_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let mut args = ingest_args(dir.path());
    args.extend(args!["--listen", &addr, "--max-streams", "1"]);
    let log = dir.path().join("ingest.log");
    let _ingest = spawn_logged(&args, &log);
    assert!(wait_for(30, || TcpStream::connect(&addr).is_ok()));
    // The probes above ended at once; wait until the ingest saw them go.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let sent = rows(500, 7);
    let first = send_stream(&addr, "first", &sent);
    std::thread::sleep(std::time::Duration::from_millis(300));
    // The refused connection is closed by the ingest: writing to it may fail, which is the
    // refusal as the client sees it, so its write errors are not the test's.
    let mut second = TcpStream::connect(&addr).unwrap();
    let _ = second
        .write_all(&wire_header("second"))
        .and_then(|()| second.write_all(&rows(10, 8)));
    drop(second);
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_for(10, || read().contains("1 streams are open (--max-streams)")),
        "{}",
        read()
    );
    drop(first);
    let outbox = dir.path().join("outbox");
    assert!(wait_for(30, || files_of(&outbox, "first").len() == 1));
    assert!(files_of(&outbox, "second").is_empty());
}
