//! The `forte-bench` binary: help for every measurement, and the full compression sweep
//! (zstd, lz4, gzip) with its front, recommendation and chart.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

/// Command-line arguments of mixed types (strings, paths) as `OsString`s.
macro_rules! args {
    ($($a:expr),* $(,)?) => { vec![$(std::ffi::OsString::from($a)),*] };
}

type Args = Vec<std::ffi::OsString>;

fn run(args: &Args) -> Output {
    Command::new(env!("CARGO_BIN_EXE_forte-bench"))
        .args(args)
        .output()
        .expect("running the forte-bench binary")
}

/// Runs forte-bench and fails the test with its stderr if it did not succeed.
fn ok(args: &Args) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "forte-bench failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs forte-bench, expects failure, returns stderr.
fn fails(args: &Args) -> String {
    let out = run(args);
    assert!(
        !out.status.success(),
        "forte-bench unexpectedly succeeded:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(1), "exit code");
    String::from_utf8(out.stderr).unwrap()
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::File::create(path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
}

/// Incompressible bytes.
fn random_bytes(len: u64) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .take(len)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// Deterministic, moderately compressible bytes.
fn sample_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let word = format!("{:08} sensor={} ", x % 100_000_000, x % 7);
        out.extend_from_slice(word.as_bytes());
    }
    out.truncate(len);
    out
}

#[test]
fn every_measurement_has_help() {
    for command in [
        vec!["--help"],
        vec!["compress", "--help"],
        vec!["ingest", "--help"],
        vec!["claims", "--help"],
    ] {
        let text = ok(&command.iter().map(Into::into).collect());
        assert!(text.contains("Usage: forte-bench"), "{command:?}: {text}");
    }
    let text = ok(&args!["--help"]);
    assert!(text.contains("Developers' measurements"), "{text}");
}

#[test]
fn bench_compress_prints_the_sweep_a_recommendation_and_a_chart() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("data/a.log"), &sample_bytes(1_500_000, 1));
    write(&dir.path().join("data/sub/b.bin"), &random_bytes(500_000));
    let out = ok(&args![
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
        "| zstd 3 |",
        "| zstd 22 |",
        "| lz4 |",
        "| gzip 9 |",
    ] {
        assert!(out.contains(row), "{row} missing:\n{out}");
    }
    assert!(out.contains("●"), "no Pareto front:\n{out}");
    assert!(out.contains("recommended: "), "{out}");
    let png = std::fs::read(dir.path().join("chart/compress.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let err = fails(&args!["compress", dir.path().join("missing")]);
    assert!(err.contains("missing"), "{err}");
}
