//! `forte-bench ingest`: compression with and without BYTE_STREAM_SPLIT, throughput on one
//! core against pyarrow and ArrowWriter, and the largest paper-rate stream count without a gap.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use forte_ingest::{Codec, FileOptions, IngestOptions, Schema};

use super::ingest_contenders::{self as bench, Run};
use forte_daemon::units::{parse_duration, parse_rate};

#[derive(clap::Args)]
pub struct IngestBench {
    /// Rows to use: a recording (wire format, with or without its first line). Default:
    /// synthetic noisy sensors.
    #[arg(long, value_name = "FILE", requires = "schema")]
    from_file: Option<PathBuf>,
    /// The recording's schema (TOML).
    #[arg(long, value_name = "FILE")]
    schema: Option<PathBuf>,
    /// Synthetic rows when no recording is given.
    #[arg(long, default_value_t = 1 << 20)]
    rows: usize,
    /// float32 columns of the synthetic rows (after a timestamp).
    #[arg(long, default_value_t = 32)]
    columns: usize,
    /// Codec of the throughput and stream runs.
    #[arg(long, default_value = "zstd", value_parser = forte_daemon::settings::parse_codec)]
    codec: Codec,
    /// Codecs whose compression ratio is compared with and without BYTE_STREAM_SPLIT.
    #[arg(long, value_delimiter = ',', default_value = "zstd:1,zstd:3,lz4,snappy", value_parser = forte_daemon::settings::parse_codec)]
    ratio_codecs: Vec<Codec>,
    /// Rows per row group.
    #[arg(long, default_value_t = 65_536)]
    rows_per_group: usize,
    /// Runs of each throughput measurement; the median is reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Python with pyarrow and numpy, for baseline (a).
    #[arg(long, default_value = "python3")]
    python: PathBuf,
    /// Each stream's rate in the gap test (the paper's turbine: 32 float32 at 25.6 kHz).
    #[arg(long, default_value = "3.28MB", value_parser = parse_rate)]
    stream_rate: f64,
    /// Length of each stream-count trial.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    trial: Duration,
    /// A generator further behind its schedule than this has a gap.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    gap: Duration,
    /// Most streams to try.
    #[arg(long, default_value_t = 256)]
    max_streams: usize,
    /// Skip the stream-count search.
    #[arg(long)]
    no_streams: bool,
    /// Scratch directory (removed parts are rewritten each run).
    #[arg(long, default_value = "/tmp/forte-bench/ingest")]
    work: PathBuf,
}

pub fn run(b: IngestBench) -> Result<bool> {
    std::fs::create_dir_all(&b.work)
        .with_context(|| format!("cannot create {}", b.work.display()))?;
    let (schema, rows) = rows(&b)?;
    compression_ratios(&b, &schema, &rows)?;
    let all_measured = one_core_throughput(&b, &schema, &rows)?;
    if !b.no_streams {
        streams(&b, &schema, &rows, &b.options(b.codec, false))?;
    }
    Ok(all_measured)
}

impl IngestBench {
    fn options(&self, codec: Codec, plain: bool) -> IngestOptions {
        IngestOptions {
            rows_per_group: self.rows_per_group,
            file: FileOptions { codec, plain },
            ..Default::default()
        }
    }
}

/// The rows every measurement uses, from the recording or synthetic, also written to
/// `rows.bin` for pyarrow; says what they are.
fn rows(b: &IngestBench) -> Result<(Schema, Vec<u8>)> {
    let (schema, rows, what) = match (&b.from_file, &b.schema) {
        (Some(file), Some(schema)) => {
            let schema = Schema::load(schema)?;
            let rows = recording_rows(file, schema.row_width())?;
            (schema, rows, format!("recording {}", file.display()))
        }
        _ => {
            let schema = Schema::sensors(b.columns);
            let rows = bench::synthetic_rows(&schema, b.rows, 1);
            let what = format!(
                "synthetic: time + {} float32 sensors, noisy sines",
                b.columns
            );
            (schema, rows, what)
        }
    };
    let rows_file = b.work.join("rows.bin");
    std::fs::write(&rows_file, &rows)
        .with_context(|| format!("cannot write {}", rows_file.display()))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "data: {what}; {} rows of {} B = {:.1} MB; machine: {cores} cores",
        rows.len() / schema.row_width(),
        schema.row_width(),
        rows.len() as f64 / 1e6
    );
    Ok((schema, rows))
}

fn compression_ratios(b: &IngestBench, schema: &Schema, rows: &[u8]) -> Result<()> {
    let raw = rows.len();
    println!("\ncompression ratio (raw row bytes / Parquet bytes), forte ingest:");
    println!("| codec | plain | BYTE_STREAM_SPLIT | gain |");
    println!("|---|---|---|---|");
    for &codec in &b.ratio_codecs {
        let plain = bench::forte_run(schema, rows, &b.options(codec, true), &b.work)?;
        let bss = bench::forte_run(schema, rows, &b.options(codec, false), &b.work)?;
        println!(
            "| {codec} | {:.3} | {:.3} | {:+.1} % |",
            plain.ratio(raw),
            bss.ratio(raw),
            (bss.ratio(raw) / plain.ratio(raw) - 1.0) * 100.0
        );
    }
    Ok(())
}

/// forte against the codec alone, ArrowWriter and pyarrow, all on one core; false when a
/// pyarrow run could not be measured.
fn one_core_throughput(b: &IngestBench, schema: &Schema, rows: &[u8]) -> Result<bool> {
    let raw = rows.len();
    println!(
        "\nthroughput on one core ({}, BYTE_STREAM_SPLIT, median of {} runs, same rows):",
        b.codec, b.runs
    );
    let one_core = b.options(b.codec, false);
    let rows_file = b.work.join("rows.bin");
    let (forte, arrow, pyarrow, ceiling) = on_one_core(|| {
        let forte = bench::median(b.runs, || {
            bench::forte_run(schema, rows, &one_core, &b.work)
        })?;
        let ceiling = bench::median(b.runs, || bench::codec_alone_run(schema, rows, &one_core))?;
        let arrow = bench::median(b.runs, || {
            bench::arrow_builder_run(schema, rows, &one_core, &b.work)
        })?;
        let pyarrow = [true, false].map(|same_pages| {
            bench::pyarrow_runs(
                &b.python, schema, &rows_file, &one_core, &b.work, b.runs, same_pages,
            )
            .map(bench::median_of)
        });
        Ok((forte, arrow, pyarrow, ceiling))
    })?;
    let line = |name: &str, r: &Run| {
        println!(
            "| {name} | {:.0} MB/s | ratio {:.3} | forte is {:.2}× |",
            r.mb_per_s(raw),
            r.ratio(raw),
            forte.mb_per_s(raw) / r.mb_per_s(raw)
        )
    };
    println!("| writer | rate | compression | forte vs it |");
    println!("|---|---|---|---|");
    line(
        "forte ingest (split columns as finished pages, the rest through the column writer)",
        &forte,
    );
    line(
        "(b) arrow-rs ArrowWriter fed row by row through builders",
        &arrow,
    );
    println!(
        "| ceiling: {} alone on the float columns' BYTE_STREAM_SPLIT pages, nothing else | {:.0} MB/s | | {:.2}× (b) at most for any writer with this codec |",
        b.codec,
        ceiling.mb_per_s(raw),
        ceiling.mb_per_s(raw) / arrow.mb_per_s(raw)
    );
    let pages = ["forte's pages", "its default 20 000-row pages"];
    for (result, pages) in pyarrow.iter().zip(pages) {
        let name = format!("(a) pyarrow: frombuffer, columns, write_table; {pages}");
        match result {
            Ok(r) => line(&name, r),
            Err(e) => println!("| {name} | not measured: {e:#} | | |"),
        }
    }
    Ok(pyarrow.iter().all(Result::is_ok))
}

/// Runs `f` on a thread pinned to one CPU; the threads it starts (ingest's writer) and the
/// processes it spawns (python) share that CPU.
fn on_one_core<T: Send>(f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                bench::pin_to_one_cpu(0)?;
                f()
            })
            .join()
            .expect("the pinned thread")
    })
}

/// The largest number of streams at the given rate with no gap: up in steps of four until a
/// trial has one, then the numbers between.
fn streams(b: &IngestBench, schema: &Schema, rows: &[u8], options: &IngestOptions) -> Result<()> {
    println!(
        "\nstreams at {:.2} MB/s each, {} s per trial, gap = a generator more than {} ms behind:",
        b.stream_rate / 1e6,
        b.trial.as_secs(),
        b.gap.as_millis()
    );
    println!(
        "| streams | offered MB/s | delivered MB/s | worst lateness | longest ingest stall | buffers | peak RSS | gap |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let trial = |n: usize| -> Result<bool> {
        let t = bench::stream_trial(
            schema,
            rows,
            options,
            &b.work,
            n,
            b.stream_rate,
            b.trial.as_secs_f64(),
        )?;
        let gap = t.worst_lateness > b.gap;
        println!(
            "| {n} | {:.1} | {:.1} | {:.3} s | {:.3} s | {:.0} MB | {:.0} MB | {} |",
            n as f64 * b.stream_rate / 1e6,
            t.bytes_per_s / 1e6,
            t.worst_lateness.as_secs_f64(),
            t.longest_stall.as_secs_f64(),
            (n * 2 * options.rows_per_group * schema.row_width()) as f64 / 1e6,
            t.rss_mid_trial as f64 / 1e6,
            if gap { "yes" } else { "no" }
        );
        Ok(!gap)
    };
    // Doubling until a trial has a gap, then halving the interval between the last good
    // count and the first bad one.
    let (mut good, mut bad) = (0, None);
    let mut n = 4;
    while n <= b.max_streams {
        if trial(n)? {
            good = n;
            n *= 2;
        } else {
            bad = Some(n);
            break;
        }
    }
    if let Some(mut high) = bad {
        while high - good > (good / 16).max(1) {
            let mid = (good + high) / 2;
            if trial(mid)? {
                good = mid;
            } else {
                high = mid;
            }
        }
    }
    println!(
        "largest stream count with no gap: {good} ({:.0} MB/s){}",
        good as f64 * b.stream_rate / 1e6,
        if bad.is_none() {
            " — the most tried; raise --max-streams"
        } else {
            ""
        }
    );
    Ok(())
}

/// The rows of a recording, without its first line if it has one.
fn recording_rows(file: &Path, width: usize) -> Result<Vec<u8>> {
    let mut bytes =
        std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let mut rows = std::io::Cursor::new(&bytes);
    forte_ingest::wire::read_optional_header(&mut rows)
        .with_context(|| format!("reading the first line of {}", file.display()))?;
    let header = rows.position() as usize;
    bytes.drain(..header);
    if bytes.len() % width != 0 || bytes.is_empty() {
        anyhow::bail!(
            "{}: {} bytes of rows is not a whole number of {width}-byte rows of the schema",
            file.display(),
            bytes.len()
        );
    }
    Ok(bytes)
}
