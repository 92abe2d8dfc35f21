//! `forte ingest`: capture row streams (TCP, or recordings replayed from files) into Parquet
//! files that appear in an outbox as ready batches for `forte send`. The work is
//! `forte_ingest::run::run`; this parses, calls it and prints what it says.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use forte_ingest::run::{run as ingest, Hooks, Run, Said, Streams};
use forte_ingest::StreamStats;

use forte_daemon::settings::{self, Config, IngestFlags, IngestSettings};
use forte_daemon::signals;
use forte_daemon::units::human;

/// What an ingest ended at once by a second signal leaves to its next start.
const INGEST_LEFT: &str =
    "rows not yet in a published file are lost, and its next start removes the unfinished files";

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
    /// Accept streams on this address (e.g. 0.0.0.0:7000); runs until stopped [config: ingest.listen].
    #[arg(long, value_name = "ADDR", required_unless_present = "from_file")]
    listen: Option<SocketAddr>,
    /// Replay recordings (one stream each, all at once) instead of listening [per run].
    #[arg(long, value_name = "FILE", num_args = 1..)]
    from_file: Vec<PathBuf>,
    #[command(flatten)]
    ingest: IngestFlags,
    /// Most streams at once; more connections are refused. Memory is at most this many times
    /// two row groups [config: ingest.max_streams].
    #[arg(long, value_name = "N", default_value_t = 256)]
    max_streams: usize,
}

const HOOKS: Hooks = Hooks {
    say,
    heed_stop: || signals::install(INGEST_LEFT),
    wait_for_stop: || signals::wait_for_stop(Duration::from_millis(100)),
};

pub fn run(args: Args, config: &Config) -> Result<bool> {
    let IngestSettings {
        schema,
        out,
        options,
    } = settings::ingest(&args.ingest, config)?;
    let streams = if args.from_file.is_empty() {
        Streams::Listen {
            addr: args
                .listen
                .expect("clap requires --listen without --from-file"),
            max_streams: args.max_streams,
        }
    } else {
        Streams::Replay(&args.from_file)
    };
    let run = Run {
        schema: &schema,
        out: &out,
        options,
        streams,
    };
    ingest(run, &HOOKS)
}

fn say(said: Said) {
    match said {
        Said::Removed { files, out } => tracing::info!("removed {files} unfinished files left in {} by an interrupted ingest",
            out.display()
        ),
        Said::Listening(l) => println!(
            "ingest listening on {} into {} ({} rows per row group, {} per stream in memory, at most {} streams, {})",
            l.addr,
            l.out.display(),
            l.rows_per_group,
            human(l.bytes_per_stream),
            l.max_streams,
            l.codec
        ),
        Said::Stream(Ok(stats)) => println!("{}", summary(&stats)),
        Said::Stream(Err(e)) => tracing::error!("{e:#}"),
        Said::Stopping => tracing::info!("stopping: publishing what every stream has received"),
        Said::Stopped => println!("stopped: every row received is in a published file"),
        // The writers' run: who ran them, the row groups written, their latency from handed
        // over to written, and writers that died and were replaced.
        Said::Writers(reading) => println!(
            "writers ({}): {} row groups written, {:.0} ms from handed over to written at p50, {:.0} ms at p87, {:.0} ms at p99; {} replaced",
            reading.scheduler.as_str(),
            reading.latency.items,
            reading.latency.p50_ms,
            reading.latency.p87_ms,
            reading.latency.p99_ms,
            reading.workers_replaced
        ),
    }
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
