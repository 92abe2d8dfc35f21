//! `forte ingest`: capture row streams (TCP, or recordings replayed from files) into Parquet
//! files that appear in an outbox as ready batches for `forte send`.

use std::io::BufReader;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use forte_ingest::wire::{self, MAGIC};
use forte_ingest::{Ingest, Schema, StreamStats};

use forte_daemon::settings::{self, Config, IngestFlags, IngestSettings};
use forte_daemon::signals;

/// What an ingest ended at once by a second signal leaves to its next start.
const INGEST_LEFT: &str =
    "rows not yet in a published file are lost, and its next start removes the unfinished files";
use forte_daemon::units::human;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "WIRE FORMAT: one TCP connection per stream. It starts with the line \
`FORTE-INGEST 1 SOURCE` and a newline, then rows back to back: the int64 timestamp \
(nanoseconds since the epoch) if the schema has one, then each column in schema order, all \
little-endian. A recording replayed with --from-file holds the same rows, with or without \
that first line (without it the file's name is the source).\n\n\
SCHEMA (TOML):\n  timestamp = \"time\"            # or false\n  [[column]]\n  name = \"s\"\n  \
count = 32                     # s00 … s31\n  type = \"float32\"              # float32 float64 int32 int64\n  \
# encoding = \"plain\"          # floats default to byte_stream_split"
)]
pub struct Args {
    /// Accept streams on this address (e.g. 0.0.0.0:7000); runs until stopped.
    #[arg(long, value_name = "ADDR", required_unless_present = "from_file")]
    listen: Option<SocketAddr>,
    /// Replay recordings (one stream each, all at once) instead of listening.
    #[arg(long, value_name = "FILE", num_args = 1..)]
    from_file: Vec<PathBuf>,
    #[command(flatten)]
    ingest: IngestFlags,
    /// Most streams at once; more connections are refused. Memory is at most this many times
    /// two row groups.
    #[arg(long, value_name = "N", default_value_t = 256)]
    max_streams: usize,
}

pub fn run(args: Args, config: &Config) -> Result<bool> {
    let IngestSettings {
        schema,
        out,
        options,
    } = settings::ingest(&args.ingest, config)?;
    let schema = Schema::load(&schema)?;
    let (ingest, removed) = Ingest::start(&out, schema, options.clone())?;
    if removed > 0 {
        eprintln!(
            "removed {removed} unfinished files left in {} by an interrupted ingest",
            out.display()
        );
    }
    let per_stream = ingest.bytes_per_stream() as u64;
    let ingest = Arc::new(ingest);
    if args.from_file.is_empty() {
        let addr = args
            .listen
            .expect("clap requires --listen without --from-file");
        let listener =
            TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
        println!(
            "ingest listening on {} into {} ({} rows per row group, {} per stream in memory, at most {} streams, {})",
            listener.local_addr()?,
            out.display(),
            options.rows_per_group,
            human(per_stream),
            args.max_streams,
            options.file.codec
        );
        let max_streams = args.max_streams;
        let server = ingest.clone();
        std::thread::spawn(move || {
            wire::serve(server, listener, max_streams, |outcome| match outcome {
                Ok(stats) => println!("{}", summary(&stats)),
                Err(e) => eprintln!("error: {e:#}"),
            })
        });
        signals::install(INGEST_LEFT);
        signals::wait_for_stop(Duration::from_millis(100));
        finish(&ingest);
        return Ok(true);
    }
    // Replays stop early on a signal too, publishing what they read.
    signals::install(INGEST_LEFT);
    {
        let ingest = ingest.clone();
        std::thread::spawn(move || {
            signals::wait_for_stop(Duration::from_millis(100));
            ingest.stop();
        });
    }
    let outcomes: Vec<Result<StreamStats>> = std::thread::scope(|scope| {
        let replays: Vec<_> = args
            .from_file
            .iter()
            .map(|file| {
                let ingest = ingest.clone();
                scope.spawn(move || replay(&ingest, file))
            })
            .collect();
        replays
            .into_iter()
            .map(|r| r.join().expect("a replay thread"))
            .collect()
    });
    let mut all_ok = true;
    for outcome in outcomes {
        match outcome {
            Ok(stats) => println!("{}", summary(&stats)),
            Err(e) => {
                all_ok = false;
                eprintln!("error: {e:#}");
            }
        }
    }
    // Each stream returned only once its last file was published: nothing is left to write.
    println!("{}", writers_summary(&ingest.reading()));
    Ok(all_ok)
}

/// The writers' run: who ran them, the row groups written, their latency from handed over to
/// written, and writers that died and were replaced.
fn writers_summary(reading: &forte_pipeline::Reading) -> String {
    let l = &reading.latency;
    format!(
        "writers ({}): {} row groups written, {:.0} ms from handed over to written at p50, {:.0} ms at p87, {:.0} ms at p99; {} replaced",
        reading.scheduler.as_str(),
        l.items,
        l.p50_ms,
        l.p87_ms,
        l.p99_ms,
        reading.workers_replaced
    )
}

/// Ends every stream at its next read, waits until they have all published, and says so.
fn finish(ingest: &Ingest) {
    eprintln!("stopping: publishing what every stream has received");
    ingest.stop();
    while ingest.active_streams() > 0 {
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("stopped: every row received is in a published file");
}

/// One recording as one stream: its first line names the source if it has one, else the
/// file's name does.
fn replay(ingest: &Ingest, file: &Path) -> Result<StreamStats> {
    let opened =
        std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    let mut input = BufReader::with_capacity(1 << 16, opened);
    let named = wire::read_optional_header(&mut input)
        .with_context(|| format!("reading the first line of {}", file.display()))?;
    let source = if let Some(source) = named {
        source
    } else {
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        if forte_ingest::stream::valid_source(&stem).is_err() {
            bail!(
                "{}: the file has no `{MAGIC} SOURCE` line and its name is not a valid source name",
                file.display()
            );
        }
        stem
    };
    ingest
        .stream(&source, &mut input)
        .with_context(|| format!("replaying {}", file.display()))
}

fn summary(s: &StreamStats) -> String {
    format!(
        "stream {} {}: {} rows ({}) in {} row groups, {} files; longest stall {:.3} s",
        s.source,
        if s.stopped { "stopped" } else { "ended" },
        s.rows,
        human(s.bytes),
        s.row_groups,
        s.files.len(),
        s.longest_stall.as_secs_f64()
    )
}
