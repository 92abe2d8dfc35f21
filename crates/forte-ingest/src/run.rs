//! A whole ingest, as `forte ingest` runs it: the outbox prepared and the writers started, then
//! streams accepted on a TCP address until a stop is asked for, or recordings replayed (all at
//! once, each one stream) until they end or a stop is asked for. What it has to say goes to the
//! caller's [`Hooks::say`], and the caller tells it when to stop (a signal, for the binary).

use std::io::BufReader;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use forte_pipeline::Reading;

use crate::wire::{self, MAGIC};
use crate::{Codec, Ingest, IngestOptions, Schema, StreamStats};

/// Where the rows come from.
pub enum Streams<'a> {
    /// Accept streams on this address until stopped, at most `max_streams` at once.
    Listen {
        addr: SocketAddr,
        max_streams: usize,
    },
    /// Replay these recordings, one stream each, all at once.
    Replay(&'a [PathBuf]),
}

/// One ingest: the schema file, the outbox, the options and the streams.
pub struct Run<'a> {
    pub schema: &'a Path,
    pub out: &'a Path,
    pub options: IngestOptions,
    pub streams: Streams<'a>,
}

/// What a listening ingest says once it listens.
pub struct Listening<'a> {
    pub addr: SocketAddr,
    pub out: &'a Path,
    pub rows_per_group: usize,
    /// Memory the buffers of one stream take.
    pub bytes_per_stream: u64,
    pub max_streams: usize,
    pub codec: Codec,
}

/// What an ingest has to say, as it happens.
pub enum Said<'a> {
    /// Unfinished files that an interrupted ingest left in the outbox were removed.
    Removed {
        files: usize,
        out: &'a Path,
    },
    Listening(Listening<'a>),
    /// A stream ended (or could not start, or was refused).
    Stream(Result<StreamStats>),
    /// A stop was asked for: every stream is ending and publishing what it received.
    Stopping,
    /// Every row received is in a published file.
    Stopped,
    /// The replays ended: the writers' run.
    Writers(Reading),
}

/// The caller's side of a run.
pub struct Hooks {
    pub say: fn(Said),
    /// Called once, when the run starts to heed a stop (the binary installs its signal
    /// handlers).
    pub heed_stop: fn(),
    /// Returns once a stop is asked for.
    pub wait_for_stop: fn(),
}

/// Runs one ingest; true when every stream ended without an error (a listening ingest, which
/// reports its streams' errors as they happen, is true once stopped).
pub fn run(run: Run, hooks: &Hooks) -> Result<bool> {
    let schema = Schema::load(run.schema)?;
    let (ingest, removed) = Ingest::start(run.out, schema, run.options.clone())?;
    if removed > 0 {
        (hooks.say)(Said::Removed {
            files: removed,
            out: run.out,
        });
    }
    let ingest = Arc::new(ingest);
    match run.streams {
        Streams::Listen { addr, max_streams } => {
            let listener =
                TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
            (hooks.say)(Said::Listening(Listening {
                addr: listener.local_addr()?,
                out: run.out,
                rows_per_group: run.options.rows_per_group,
                bytes_per_stream: ingest.bytes_per_stream() as u64,
                max_streams,
                codec: run.options.file.codec,
            }));
            listen(ingest, listener, max_streams, hooks);
            Ok(true)
        }
        Streams::Replay(files) => replay_all(&ingest, files, hooks),
    }
}

/// Serves streams on `listener` until a stop is asked for, then ends them and waits until they
/// have all published.
fn listen(ingest: Arc<Ingest>, listener: TcpListener, max_streams: usize, hooks: &Hooks) {
    let server = ingest.clone();
    let say = hooks.say;
    std::thread::spawn(move || {
        wire::serve(server, listener, max_streams, move |outcome| {
            say(Said::Stream(outcome))
        })
    });
    (hooks.heed_stop)();
    (hooks.wait_for_stop)();
    finish(&ingest, say);
}

/// Ends every stream at its next read, waits until they have all published, and says so.
fn finish(ingest: &Ingest, say: fn(Said)) {
    say(Said::Stopping);
    ingest.stop();
    while ingest.active_streams() > 0 {
        std::thread::sleep(Duration::from_millis(50));
    }
    say(Said::Stopped);
}

/// Replays every recording at once; true when each ended without an error.
fn replay_all(ingest: &Arc<Ingest>, files: &[PathBuf], hooks: &Hooks) -> Result<bool> {
    // Replays stop early on a stop too, publishing what they read.
    (hooks.heed_stop)();
    {
        let ingest = ingest.clone();
        let wait_for_stop = hooks.wait_for_stop;
        std::thread::spawn(move || {
            wait_for_stop();
            ingest.stop();
        });
    }
    let outcomes: Vec<Result<StreamStats>> = std::thread::scope(|scope| {
        let replays: Vec<_> = files
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
        all_ok &= outcome.is_ok();
        (hooks.say)(Said::Stream(outcome));
    }
    // Each stream returned only once its last file was published: nothing is left to write.
    (hooks.say)(Said::Writers(ingest.reading()));
    Ok(all_ok)
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
        if crate::stream::valid_source(&stem).is_err() {
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
