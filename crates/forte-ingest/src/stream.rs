//! Streams of rows into Parquet files: each stream fills one of its two row-group buffers
//! while a writer from a shared pool writes the other.
//!
//! The writers are the `write` stage of a forte-pipeline pipeline, run by its scheduler (under
//! Ordo, a pool whose worker that dies is replaced: the stream whose buffer it held fails,
//! naming the stream, and the others go on). The stage's counters and each buffer's latency
//! from handed over to written are the pipeline's.
//!
//! Back-pressure, not loss: a stream whose writer has not handed back the other buffer waits,
//! and while it waits it does not read its input, so a TCP sender is slowed by TCP itself.
//! That wait is the paper's "gap"; each stream reports its longest.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use crossbeam_channel::{Receiver, Sender};
use forte_pipeline::{Budget, Gate, Pipeline, Reading, Salvage, Scheduling, Weigh};
use parking_lot::Mutex;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::Type;

use crate::parquet_file::{self, FileOptions, OpenFile};
use crate::rowgroup::RowGroup;
use crate::schema::Schema;

#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// Rows per row group: the size of each of a stream's two buffers.
    pub rows_per_group: usize,
    /// A file is closed and published after this many row groups.
    pub row_groups_per_file: usize,
    /// A partly filled buffer is written after this long, so slow streams still publish.
    pub flush_after: Duration,
    /// Writers of row groups, shared by all streams: the CPU budget of the write stage.
    pub writers: usize,
    /// Who runs the writers.
    pub scheduling: Scheduling,
    pub file: FileOptions,
}

impl Default for IngestOptions {
    fn default() -> Self {
        Self {
            rows_per_group: 65_536,
            row_groups_per_file: 16,
            flush_after: Duration::from_secs(10),
            writers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            scheduling: Scheduling::default(),
            file: FileOptions::default(),
        }
    }
}

/// What one stream delivered.
#[derive(Debug, Clone, Default)]
pub struct StreamStats {
    pub source: String,
    pub rows: u64,
    /// Row bytes received.
    pub bytes: u64,
    pub row_groups: u64,
    /// Published files, in order.
    pub files: Vec<PathBuf>,
    /// The longest time the stream waited for a free buffer (not reading its input).
    pub longest_stall: Duration,
    pub total_stall: Duration,
    pub seconds: f64,
    /// Ended by [`Ingest::stop`], not by its input; a row cut by the stop is dropped.
    pub stopped: bool,
}

/// A stream's output side: the file being written and what was published. Only one of a
/// stream's buffers is ever with a writer, so the lock is never contended.
struct Output {
    source: String,
    file: Option<OpenFile>,
    published: Vec<PathBuf>,
    row_groups: u64,
    error: Option<String>,
}

/// A filled buffer waiting for a writer; `last` closes the file after it (the stream ended).
struct Filled {
    group: RowGroup,
    last: bool,
}

/// What the writers share with one stream: its output, its filled buffers in order, and the
/// way its emptied buffers go back.
struct Lane {
    output: Mutex<Output>,
    filled: Mutex<VecDeque<Filled>>,
    back: Sender<RowGroup>,
    /// A blank buffer's shape, for one lost with a writer that died.
    schema: Arc<Schema>,
    rows_per_group: usize,
    plain: bool,
}

impl Lane {
    fn blank(&self) -> RowGroup {
        RowGroup::new(&self.schema, self.rows_per_group, self.plain)
    }
}

/// One filled buffer of a stream to write, then the emptied buffer to give back. Jobs name the
/// stream, not the buffer: the writer that holds the stream's output takes the oldest of its
/// filled buffers, so two writers working for one stream still write its row groups in order.
struct Job {
    lane: Arc<Lane>,
    /// The buffer, once written and cleared.
    emptied: Option<RowGroup>,
    bytes: u64,
    handed_over: Instant,
}

impl Weigh for Job {
    const ITEM: &'static str = "row group";

    fn weight(&self) -> u64 {
        self.bytes
    }

    /// Its latency runs from the moment the stream handed the buffer over.
    fn read_at(&self) -> Option<Instant> {
        Some(self.handed_over)
    }
}

/// A writer that dies holding a job fails the job's stream; a blank buffer goes back in place of
/// the one lost, so the stream, which waits for it, hears the failure.
impl Salvage for Job {
    type Remains = Arc<Lane>;

    fn remains(&self) -> Arc<Lane> {
        self.lane.clone()
    }

    fn lost(lane: Arc<Lane>, error: String) -> Self {
        lane.output.lock().error.get_or_insert(error);
        Self {
            emptied: Some(lane.blank()),
            lane,
            bytes: 0,
            handed_over: Instant::now(),
        }
    }
}

/// One stream's side of the writer pool: its two buffers, sent filled to the writers and
/// coming back empty.
struct Stream<'a> {
    source: &'a str,
    jobs: &'a Sender<Job>,
    spare: Receiver<RowGroup>,
    lane: Arc<Lane>,
}

impl<'a> Stream<'a> {
    fn open(ingest: &'a Ingest, source: &'a str) -> Result<Self> {
        let jobs = ingest.jobs.as_ref().context("the ingest is shut down")?;
        let (back, spare) = crossbeam_channel::bounded::<RowGroup>(2);
        let lane = Arc::new(Lane {
            output: Mutex::new(Output {
                source: source.to_string(),
                file: None,
                published: Vec::new(),
                row_groups: 0,
                error: None,
            }),
            filled: Mutex::new(VecDeque::with_capacity(2)),
            back,
            schema: ingest.schema.clone(),
            rows_per_group: ingest.options.rows_per_group,
            plain: ingest.options.file.plain,
        });
        for _ in 0..2 {
            lane.back.send(lane.blank()).expect("room for two buffers");
        }
        Ok(Self {
            source,
            jobs,
            spare,
            lane,
        })
    }

    /// The next empty buffer, waiting for a writer to give one back (the stall the stream's
    /// statistics report); fails if a writer failed on this stream.
    fn take(&self, stats: &mut StreamStats) -> Result<RowGroup> {
        let waited = Instant::now();
        let group = self.spare.recv().context("the ingest writers stopped")?;
        let stall = waited.elapsed();
        stats.longest_stall = stats.longest_stall.max(stall);
        stats.total_stall += stall;
        if let Some(e) = &self.lane.output.lock().error {
            bail!("stream {}: {e}", self.source);
        }
        Ok(group)
    }

    /// Hands a filled buffer to the writers; `last` closes the file after it.
    fn submit(&self, group: RowGroup, last: bool) -> Result<()> {
        let bytes = (group.rows() * self.lane.schema.row_width()) as u64;
        self.lane.filled.lock().push_back(Filled { group, last });
        self.jobs
            .send(Job {
                lane: self.lane.clone(),
                emptied: None,
                bytes,
                handed_over: Instant::now(),
            })
            .map_err(|_| anyhow::anyhow!("the ingest writers stopped"))
    }

    /// Writes the last rows and closes the file, waits until both buffers are back, and
    /// notes what was published.
    fn close(&self, filling: RowGroup, stats: &mut StreamStats) -> Result<()> {
        self.submit(filling, true)?;
        self.take(stats)?;
        self.take(stats)?;
        let output = self.lane.output.lock();
        stats.files = output.published.clone();
        stats.row_groups = output.row_groups;
        Ok(())
    }
}

/// The ingest of one outbox: a pool of writers and any number of streams.
pub struct Ingest {
    schema: Arc<Schema>,
    options: IngestOptions,
    jobs: Option<Sender<Job>>,
    /// The writers' pipeline (its `write` stage), run on a thread of its own.
    pipeline: Pipeline,
    writers: Option<std::thread::JoinHandle<()>>,
    /// Set by [`Ingest::stop`]: streams end as if their input had ended.
    stopping: AtomicBool,
    active: AtomicUsize,
}

/// Room in the writers' queues: more than two buffers of every stream of any ingest measured
/// (256 streams), so that a stream hands over a buffer without waiting behind the others'.
const JOBS_QUEUED: usize = 1024;

/// Where the writers write, and how.
struct Writing {
    outbox: PathBuf,
    schema: Arc<Type>,
    props: Arc<WriterProperties>,
    per_file: usize,
}

impl Ingest {
    /// Prepares `outbox` (removing files a killed run left unfinished) and starts the writers.
    /// Returns the ingest and how many unfinished files were removed.
    pub fn start(outbox: &Path, schema: Schema, options: IngestOptions) -> Result<(Self, usize)> {
        if options.rows_per_group == 0 || options.row_groups_per_file == 0 {
            bail!("rows per row group and row groups per file must be at least 1");
        }
        std::fs::create_dir_all(outbox)
            .with_context(|| format!("cannot create the outbox {}", outbox.display()))?;
        let removed = parquet_file::remove_unfinished(outbox)?;
        let writing = Writing {
            outbox: outbox.to_path_buf(),
            schema: parquet_file::parquet_schema(&schema)?,
            props: parquet_file::properties(&schema, &options.file),
            per_file: options.row_groups_per_file,
        };
        let writers = options.writers.max(1);
        let pipeline = Pipeline::new(Budget::new(writers as u64), options.scheduling);
        let (jobs, queue) = forte_pipeline::queue::<Job>(JOBS_QUEUED);
        let runner = pipeline.clone();
        let thread = std::thread::Builder::new()
            .name("ingest-writers".into())
            .spawn(move || {
                runner.run(|s| {
                    let (handed, filled) = forte_pipeline::queue::<Job>(JOBS_QUEUED);
                    let (written, emptied) = forte_pipeline::queue::<Job>(JOBS_QUEUED);
                    // The streams are outside the pipeline: a stage takes their buffers in,
                    // so that the writers hear of each at once (an idle pool worker looks
                    // for work on its own only every 200 ms: 200 ms more per buffer at p99).
                    s.io("hand_over", 1, queue, handed, |job, emit| {
                        emit.send(job);
                    });
                    s.cpu("write", writers, filled, written, move |job, emit| {
                        emit.send(write_job(job, &writing));
                    });
                    s.sink("give_back", Gate::fixed(1), emptied, give_back);
                })
            })
            .context("starting the ingest writers")?;
        Ok((
            Self {
                schema: Arc::new(schema),
                options,
                jobs: Some(jobs),
                pipeline,
                writers: Some(thread),
                stopping: AtomicBool::new(false),
                active: AtomicUsize::new(0),
            },
            removed,
        ))
    }

    /// The writers' run so far: their scheduler, the `write` stage's counters and the row
    /// groups' latency from handed over to written.
    pub fn reading(&self) -> Reading {
        self.pipeline.reading()
    }

    /// Memory the buffers of one stream take: two row groups.
    pub fn bytes_per_stream(&self) -> usize {
        2 * self.options.rows_per_group * self.schema.row_width()
    }

    /// Ends every stream at its next read (within a socket's read timeout) as if its input had
    /// ended: what was received is written and published. For a clean stop on a signal.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Streams still running.
    pub fn active_streams(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Reads rows from `input` until it ends, writing them into files named after `source`.
    /// Reads that time out (a socket's read timeout) only give the flush timer a chance.
    pub fn stream(&self, source: &str, input: &mut dyn Read) -> Result<StreamStats> {
        struct Active<'a>(&'a AtomicUsize);
        impl Drop for Active<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.active.fetch_add(1, Ordering::SeqCst);
        let _active = Active(&self.active);
        let started = Instant::now();
        let width = self.schema.row_width();
        let lane = Stream::open(self, source)?;
        let mut stats = StreamStats {
            source: source.to_string(),
            ..Default::default()
        };
        let mut filling = lane.take(&mut stats)?;
        let mut filling_since: Option<Instant> = None;
        // Whole rows are scattered straight from this buffer; a row cut by a read waits here
        // for its remaining bytes.
        let mut pending = vec![0u8; (1 << 20) / width * width + width];
        let mut held = 0;
        while !self.stopping.load(Ordering::SeqCst) {
            let read = match input.read(&mut pending[held..]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => 0,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).with_context(|| format!("reading stream {source}")),
            };
            held += read;
            stats.bytes += read as u64;
            let whole = held / width * width;
            let mut at = 0;
            while at < whole {
                let rows = ((whole - at) / width).min(filling.room());
                filling.push_rows(&pending[at..at + rows * width]);
                filling_since.get_or_insert_with(Instant::now);
                at += rows * width;
                if filling.room() == 0 {
                    lane.submit(filling, false)?;
                    filling = lane.take(&mut stats)?;
                    filling_since = None;
                }
            }
            pending.copy_within(at..held, 0);
            held -= at;
            if filling_since.is_some_and(|t| t.elapsed() >= self.options.flush_after) {
                lane.submit(filling, false)?;
                filling = lane.take(&mut stats)?;
                filling_since = None;
            }
        }
        stats.rows = (stats.bytes - held as u64) / width as u64;
        lane.close(filling, &mut stats)?;
        stats.seconds = started.elapsed().as_secs_f64();
        stats.stopped = self.stopping.load(Ordering::SeqCst);
        if held > 0 && !stats.stopped {
            bail!(
                "stream {source} ended inside a row ({held} of its {width} bytes): the rows before it are in {} files",
                stats.files.len()
            );
        }
        Ok(stats)
    }

    /// Waits for the writers to finish what they have.
    pub fn shut_down(mut self) {
        self.jobs.take();
        if let Some(writers) = self.writers.take() {
            let _ = writers.join();
        }
    }
}

/// Writes the oldest filled buffer of the job's stream (unless the stream failed) and clears
/// it for the stream's next rows.
fn write_job(mut job: Job, w: &Writing) -> Job {
    let mut out = job.lane.output.lock();
    let Filled { mut group, last } = job
        .lane
        .filled
        .lock()
        .pop_front()
        .expect("a filled buffer per job");
    if out.error.is_none() {
        let written = write_group(&mut out, &mut group, last, w);
        if let Err(e) = written {
            out.error = Some(format!("{e:#}"));
        }
    }
    drop(out);
    group.clear();
    job.emptied = Some(group);
    job
}

/// Gives the emptied buffer back to its stream (which may have ended on an error).
fn give_back(job: Job) {
    if let Some(group) = job.emptied {
        let _ = job.lane.back.send(group);
    }
}

fn write_group(out: &mut Output, group: &mut RowGroup, last: bool, w: &Writing) -> Result<()> {
    if !group.is_empty() {
        if out.file.is_none() {
            let name = batch_name(&out.source);
            out.file = Some(OpenFile::create(&w.outbox, &name, &w.schema, &w.props)?);
        }
        let file = out.file.as_mut().expect("opened above");
        file.write(group)?;
        out.row_groups += 1;
    }
    let full = out
        .file
        .as_ref()
        .is_some_and(|f| f.row_groups >= w.per_file);
    if full || last {
        if let Some(file) = out.file.take() {
            let published = file.publish(&w.outbox)?;
            out.published.push(published);
        }
    }
    Ok(())
}

/// `SOURCE-YYYYMMDDTHHMMSS.mmmZ-PID-N`: sorted by time; unique across restarts (the process
/// id) and for two streams of one source (the counter).
fn batch_name(source: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    format!(
        "{source}-{}-{}-{seq}",
        compact_utc(millis),
        std::process::id()
    )
}

/// A Unix time in milliseconds as `YYYYMMDDTHHMMSS.mmmZ`: sortable, and safe in file names.
fn compact_utc(millis: u64) -> String {
    let time = chrono::DateTime::from_timestamp_millis(millis as i64).unwrap_or_default();
    time.format("%Y%m%dT%H%M%S%.3fZ").to_string()
}

/// Checks a source name from the wire: it names files, so only `[A-Za-z0-9._-]`, not
/// starting with a dot, at most 64 characters.
pub fn valid_source(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        bail!("source name {name:?}: use 1–64 of A–Z a–z 0–9 . _ -, not starting with a dot");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_names_carry_the_utc_time_to_the_millisecond() {
        assert_eq!(compact_utc(1_795_305_600_123), "20261122T000000.123Z");
        assert_eq!(compact_utc(951_782_400_000), "20000229T000000.000Z");
    }

    #[test]
    fn a_writer_that_dies_fails_its_stream_by_name_and_the_stream_does_not_wait_forever() {
        let out = tempfile::tempdir().unwrap();
        let options = IngestOptions {
            rows_per_group: 10,
            ..Default::default()
        };
        let (ingest, _) = Ingest::start(out.path(), Schema::sensors(2), options).unwrap();
        let stream = Stream::open(&ingest, "turbine-7").unwrap();
        let mut stats = StreamStats::default();
        let handed_over = stream.take(&mut stats).unwrap();
        // The writer holding it died: the pool sends on what Salvage makes of the job.
        let error = "the write stage's worker died: boom".to_owned();
        give_back(Job::lost(stream.lane.clone(), error));
        drop(handed_over);
        let failed = stream.take(&mut stats).unwrap_err();
        assert_eq!(
            failed.to_string(),
            "stream turbine-7: the write stage's worker died: boom"
        );
        // The lost buffer's stand-in came back too: the stream's close does not hang on it.
        assert!(stream.spare.try_recv().is_ok());
        ingest.shut_down();
    }
}
