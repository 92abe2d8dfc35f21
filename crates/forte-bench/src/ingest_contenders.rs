//! What `forte-bench ingest` measures: synthetic sensor rows, forte's ingest of them from
//! memory, and the buffered-writer baseline of the paper (arrow-rs `ArrowWriter` fed by
//! appending each row to array builders), on the same row bytes with the same encodings and
//! codec.

use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use arrow_array::builder::{Float32Builder, Float64Builder, Int32Builder, Int64Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::ArrowWriter;
use parquet::schema::types::SchemaDescriptor;

use forte_ingest::parquet_file::{parquet_schema, properties, PageCodec};
use forte_ingest::rowgroup::{RowGroup, Values};
use forte_ingest::schema::{Kind, Schema};
use forte_ingest::wire;
use forte_ingest::{Codec, Ingest, IngestOptions, StreamStats};

/// `rows` rows of `schema` that look like noisy sensors: a slow sine per column plus noise of
/// a few percent, sampled at 25.6 kHz (the paper's turbines).
pub fn synthetic_rows(schema: &Schema, rows: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows * schema.row_width());
    let mut x = seed | 1;
    let mut noise = move || {
        // xorshift, then the sum of four uniforms: roughly normal, cheap.
        let mut sum = 0.0;
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            sum += (x >> 11) as f64 / (1u64 << 53) as f64;
        }
        sum - 2.0
    };
    let start_ns = 1_795_305_600_000_000_000i64;
    for r in 0..rows {
        let t = r as f64 / 25_600.0;
        if schema.timestamp.is_some() {
            out.extend_from_slice(&(start_ns + (t * 1e9) as i64).to_le_bytes());
        }
        for (c, column) in schema.columns.iter().enumerate() {
            let v = 100.0
                + c as f64
                + 5.0 * (std::f64::consts::TAU * (50.0 + c as f64) * t).sin()
                + 0.5 * noise();
            match column.kind {
                Kind::Float32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
                Kind::Float64 => out.extend_from_slice(&v.to_le_bytes()),
                Kind::Int32 => out.extend_from_slice(&((v * 100.0) as i32).to_le_bytes()),
                Kind::Int64 => out.extend_from_slice(&((v * 100.0) as i64).to_le_bytes()),
            }
        }
    }
    out
}

/// One measured write of the row bytes into Parquet.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub seconds: f64,
    /// Bytes of Parquet written.
    pub written: u64,
}

impl Run {
    pub fn mb_per_s(&self, raw: usize) -> f64 {
        raw as f64 / 1e6 / self.seconds
    }

    pub fn ratio(&self, raw: usize) -> f64 {
        raw as f64 / self.written as f64
    }
}

/// forte's ingest of `rows` (one stream, one writer) into a fresh directory under `work`.
pub fn forte_run(
    schema: &Schema,
    rows: &[u8],
    options: &IngestOptions,
    work: &Path,
) -> Result<Run> {
    let out = fresh(work, "forte")?;
    let options = IngestOptions {
        writers: 1,
        ..options.clone()
    };
    let (ingest, _) = Ingest::start(&out, schema.clone(), options)?;
    let start = Instant::now();
    let stats = ingest.stream("bench", &mut Cursor::new(rows))?;
    let seconds = start.elapsed().as_secs_f64();
    ingest.shut_down();
    let written = stats
        .files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;
    Ok(Run { seconds, written })
}

/// The codec alone on the pages of the split columns (their BYTE_STREAM_SPLIT streams, row
/// group by row group, one reused context), timed without anything else; the row groups are
/// filled before the clock starts. No writer using this codec can be faster: raw row bytes
/// over this time is the ceiling of every writer's one-core rate. (The timestamp column is
/// left out, which only raises the ceiling.)
pub fn codec_alone_run(schema: &Schema, rows: &[u8], options: &IngestOptions) -> Result<Run> {
    let width = schema.row_width();
    let mut groups: Vec<RowGroup> = rows
        .chunks(options.rows_per_group * width)
        .map(|chunk| {
            let mut group = RowGroup::new(schema, options.rows_per_group, false);
            group.push_rows(chunk);
            group
        })
        .collect();
    let mut codec = PageCodec::new(options.file.codec.parquet())?;
    let mut page = Vec::new();
    let mut written = 0;
    let start = Instant::now();
    for group in &mut groups {
        for values in &mut group.columns {
            if let Values::Split(split) = values {
                codec.compress(split.encoded(), &mut page)?;
                written += page.len() as u64;
            }
        }
    }
    Ok(Run {
        seconds: start.elapsed().as_secs_f64(),
        written,
    })
}

/// The paper's baseline: every row appended value by value to Arrow array builders, a record
/// batch per row group handed to `ArrowWriter`, with forte's writer properties.
pub fn arrow_builder_run(
    schema: &Schema,
    rows: &[u8],
    options: &IngestOptions,
    work: &Path,
) -> Result<Run> {
    let out = fresh(work, "arrow")?;
    let path = out.join("arrow.parquet");
    // The Arrow schema of forte's own Parquet schema, so both writers write the same columns.
    let arrow_schema = Arc::new(parquet::arrow::parquet_to_arrow_schema(
        &SchemaDescriptor::new(parquet_schema(schema)?),
        None,
    )?);
    let start = Instant::now();
    let file = std::fs::File::create(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    let props = (*properties(schema, &options.file)).clone();
    let mut writer = ArrowWriter::try_new(file, arrow_schema.clone(), Some(props))?;
    let group = options.rows_per_group;
    let mut builders = Builders::new(schema, group);
    for row in rows.chunks_exact(schema.row_width()) {
        builders.append(row);
        if builders.rows == group {
            writer.write(&builders.finish(&arrow_schema)?)?;
            writer.flush()?;
        }
    }
    if builders.rows > 0 {
        writer.write(&builders.finish(&arrow_schema)?)?;
    }
    writer.close()?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(Run {
        seconds,
        written: std::fs::metadata(&path)?.len(),
    })
}

enum Builder {
    Float32(Float32Builder),
    Float64(Float64Builder),
    Int32(Int32Builder),
    Int64(Int64Builder),
}

struct Builders {
    timestamp: Option<Int64Builder>,
    columns: Vec<Builder>,
    rows: usize,
}

impl Builders {
    fn new(schema: &Schema, capacity: usize) -> Self {
        Self {
            timestamp: schema
                .timestamp
                .as_ref()
                .map(|_| Int64Builder::with_capacity(capacity)),
            columns: schema
                .columns
                .iter()
                .map(|c| match c.kind {
                    Kind::Float32 => Builder::Float32(Float32Builder::with_capacity(capacity)),
                    Kind::Float64 => Builder::Float64(Float64Builder::with_capacity(capacity)),
                    Kind::Int32 => Builder::Int32(Int32Builder::with_capacity(capacity)),
                    Kind::Int64 => Builder::Int64(Int64Builder::with_capacity(capacity)),
                })
                .collect(),
            rows: 0,
        }
    }

    fn append(&mut self, row: &[u8]) {
        let mut at = 0;
        let mut next = |n: usize| {
            let bytes = &row[at..at + n];
            at += n;
            bytes
        };
        if let Some(b) = &mut self.timestamp {
            b.append_value(i64::from_le_bytes(next(8).try_into().unwrap()));
        }
        for b in &mut self.columns {
            match b {
                Builder::Float32(b) => {
                    b.append_value(f32::from_le_bytes(next(4).try_into().unwrap()))
                }
                Builder::Float64(b) => {
                    b.append_value(f64::from_le_bytes(next(8).try_into().unwrap()))
                }
                Builder::Int32(b) => {
                    b.append_value(i32::from_le_bytes(next(4).try_into().unwrap()))
                }
                Builder::Int64(b) => {
                    b.append_value(i64::from_le_bytes(next(8).try_into().unwrap()))
                }
            }
        }
        self.rows += 1;
    }

    fn finish(&mut self, schema: &Arc<arrow_schema::Schema>) -> Result<RecordBatch> {
        let mut arrays: Vec<ArrayRef> = Vec::new();
        if let Some(b) = &mut self.timestamp {
            let DataType::Timestamp(_, zone) = schema.field(0).data_type() else {
                anyhow::bail!("the first column of a schema with a timestamp is the timestamp");
            };
            arrays.push(Arc::new(
                b.finish()
                    .reinterpret_cast::<arrow_array::types::TimestampNanosecondType>()
                    .with_timezone_opt(zone.clone()),
            ));
        }
        for b in &mut self.columns {
            arrays.push(match b {
                Builder::Float32(b) => Arc::new(b.finish()),
                Builder::Float64(b) => Arc::new(b.finish()),
                Builder::Int32(b) => Arc::new(b.finish()),
                Builder::Int64(b) => Arc::new(b.finish()),
            });
        }
        self.rows = 0;
        Ok(RecordBatch::try_new(schema.clone(), arrays)?)
    }
}

/// The median of `runs` runs of `run`, by time.
pub fn median(runs: usize, mut run: impl FnMut() -> Result<Run>) -> Result<Run> {
    Ok(median_of(
        (0..runs.max(1)).map(|_| run()).collect::<Result<_>>()?,
    ))
}

/// The run of median time among `runs` (at least one).
pub fn median_of(mut runs: Vec<Run>) -> Run {
    runs.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    runs[runs.len() / 2]
}

fn fresh(work: &Path, name: &str) -> Result<std::path::PathBuf> {
    let dir = work.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// Keeps the calling thread, and the threads it starts afterwards, on one CPU: the paper's
/// comparison is per core.
pub fn pin_to_one_cpu(cpu: usize) -> Result<()> {
    // SAFETY: the set is a plain bit mask we own; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error()).context("pinning to one CPU");
        }
    }
    Ok(())
}

/// The schema as baseline_pyarrow.py (and the tests' readback) take it.
pub fn schema_json(schema: &Schema) -> String {
    let kind = |k: Kind| match k {
        Kind::Float32 => "float32",
        Kind::Float64 => "float64",
        Kind::Int32 => "int32",
        Kind::Int64 => "int64",
    };
    let columns: Vec<String> = schema
        .columns
        .iter()
        .map(|c| format!("[\"{}\", \"{}\"]", c.name, kind(c.kind)))
        .collect();
    let timestamp = schema
        .timestamp
        .as_ref()
        .map_or("null".to_string(), |t| format!("\"{t}\""));
    let statistics: Vec<String> = schema
        .timestamp
        .iter()
        .chain(
            schema
                .columns
                .iter()
                .filter(|c| c.statistics)
                .map(|c| &c.name),
        )
        .map(|n| format!("\"{n}\""))
        .collect();
    format!(
        "{{\"timestamp\": {timestamp}, \"columns\": [{}], \"statistics\": [{}]}}",
        columns.join(", "),
        statistics.join(", ")
    )
}

/// Baseline (a): pyarrow on the rows in `rows_file`, `runs` times in one interpreter, with
/// forte's page layout (`same_pages`) or pyarrow's default one (pages cut at 20 000 rows).
pub fn pyarrow_runs(
    python: &Path,
    schema: &Schema,
    rows_file: &Path,
    options: &IngestOptions,
    work: &Path,
    runs: usize,
    same_pages: bool,
) -> Result<Vec<Run>> {
    let out = fresh(work, "pyarrow")?;
    let script = out.join("baseline_pyarrow.py");
    std::fs::write(&script, include_str!("baseline_pyarrow.py"))?;
    let (codec, level) = match options.file.codec {
        Codec::Zstd(level) => ("zstd", level),
        Codec::Lz4 => ("lz4", 0),
        Codec::Snappy => ("snappy", 0),
        Codec::None => ("none", 0),
    };
    let output = std::process::Command::new(python)
        .arg(&script)
        .arg(rows_file)
        .arg(schema_json(schema))
        .arg(out.join("pyarrow.parquet"))
        .args([codec, &level.to_string()])
        .arg(if options.file.plain { "0" } else { "1" })
        .arg(options.rows_per_group.to_string())
        .arg(runs.to_string())
        .arg(if same_pages { "forte" } else { "default" })
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !output.status.success() {
        anyhow::bail!(
            "the pyarrow baseline failed (does {} have pyarrow and numpy? pip install pyarrow numpy): {}",
            python.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let printed = String::from_utf8_lossy(&output.stdout);
    let (seconds, written) = parse_baseline(&printed)
        .with_context(|| format!("unexpected output of the pyarrow baseline: {printed}"))?;
    Ok(seconds
        .into_iter()
        .map(|seconds| Run { seconds, written })
        .collect())
}

/// `{"seconds": [a, b, …], "bytes": n}` without a JSON dependency in this crate.
fn parse_baseline(text: &str) -> Option<(Vec<f64>, u64)> {
    let list = text.split_once("\"seconds\": [")?.1.split_once(']')?.0;
    let seconds = list
        .split(',')
        .map(|s| s.trim().parse().ok())
        .collect::<Option<Vec<f64>>>()?;
    let bytes = text
        .split_once("\"bytes\": ")?
        .1
        .trim_end()
        .trim_end_matches('}')
        .trim()
        .parse()
        .ok()?;
    Some((seconds, bytes))
}

/// What the generators of one trial saw.
#[derive(Debug, Clone)]
pub struct Trial {
    /// The furthest any generator fell behind its schedule: time it was blocked by TCP
    /// back-pressure beyond what the socket buffers absorbed.
    pub worst_lateness: Duration,
    /// The longest any stream waited inside ingest for a free buffer.
    pub longest_stall: Duration,
    /// Row bytes delivered per second, all streams together.
    pub bytes_per_s: f64,
    /// This process's resident memory half way through (ingest and generators).
    pub rss_mid_trial: u64,
}

/// Runs `streams` TCP streams of `rows` (looped) at `rate` bytes/s each for `seconds` into a
/// fresh ingest, like the paper's turbines.
pub fn stream_trial(
    schema: &Schema,
    rows: &[u8],
    options: &IngestOptions,
    work: &Path,
    streams: usize,
    rate: f64,
    seconds: f64,
) -> Result<Trial> {
    let out = fresh(work, "streams")?;
    let (ingest, _) = Ingest::start(&out, schema.clone(), options.clone())?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let outcomes = serve(Arc::new(ingest), listener);
    // Ticks of 10 ms: each sends its share of the rate in whole rows.
    let width = schema.row_width();
    let tick = Duration::from_millis(10);
    let generator = Generator {
        rows,
        tick,
        per_tick: ((rate * tick.as_secs_f64()) as usize / width).max(1) * width,
        seconds,
    };
    let started = Instant::now();
    let mut rss_mid_trial = 0;
    let lateness: Vec<Duration> = std::thread::scope(|scope| {
        let generators: Vec<_> = (0..streams)
            .map(|i| scope.spawn(move || generator.run(addr, i)))
            .collect();
        std::thread::sleep(Duration::from_secs_f64(seconds / 2.0));
        rss_mid_trial = resident_bytes();
        generators
            .into_iter()
            .map(|g| g.join().expect("a generator").unwrap_or(Duration::MAX))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let (longest_stall, bytes) = wait_for_reports(&outcomes, streams)?;
    let _ = std::fs::remove_dir_all(&out);
    Ok(Trial {
        worst_lateness: lateness.into_iter().max().unwrap_or_default(),
        longest_stall,
        bytes_per_s: bytes as f64 / elapsed,
        rss_mid_trial,
    })
}

/// What each stream of a trial reported when it ended.
type Outcomes = Arc<parking_lot::Mutex<Vec<Result<StreamStats, String>>>>;

/// Serves `listener` into `ingest` on a thread of its own, which outlives the trial, idle in
/// accept, until the bench exits.
fn serve(ingest: Arc<Ingest>, listener: std::net::TcpListener) -> Outcomes {
    let outcomes = Outcomes::default();
    let reports = outcomes.clone();
    std::thread::spawn(move || {
        wire::serve(ingest, listener, usize::MAX, move |outcome| {
            reports.lock().push(outcome.map_err(|e| format!("{e:#}")));
        })
    });
    outcomes
}

/// Each stream ends when its generator closes: waits (a minute at most) for all `streams`
/// reports and returns the longest stall and the bytes they received.
fn wait_for_reports(outcomes: &Outcomes, streams: usize) -> Result<(Duration, u64)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while outcomes.lock().len() < streams && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let reports = std::mem::take(&mut *outcomes.lock());
    let mut longest_stall = Duration::ZERO;
    let mut bytes = 0;
    for r in reports {
        let stats = r.map_err(anyhow::Error::msg)?;
        longest_stall = longest_stall.max(stats.longest_stall);
        bytes += stats.bytes;
    }
    Ok((longest_stall, bytes))
}

/// One sensor of a trial: `per_tick` bytes of `rows` every `tick`, for `seconds`.
#[derive(Clone, Copy)]
struct Generator<'a> {
    rows: &'a [u8],
    tick: Duration,
    per_tick: usize,
    seconds: f64,
}

impl Generator<'_> {
    /// Streams as source `turbine-I` and returns how far it fell behind its schedule at worst.
    fn run(self, addr: std::net::SocketAddr, i: usize) -> Result<Duration> {
        use std::io::Write;
        let rows = self.rows;
        let mut conn = std::net::TcpStream::connect(addr)?;
        conn.write_all(wire::header(&format!("turbine-{i:03}")).as_bytes())?;
        let (mut worst, mut at, mut k) =
            (Duration::ZERO, (i * self.per_tick * 7) % rows.len(), 0u32);
        let begin = Instant::now();
        while begin.elapsed().as_secs_f64() < self.seconds {
            let due = begin + self.tick * k;
            let now = Instant::now();
            if now < due {
                std::thread::sleep(due - now);
            } else {
                worst = worst.max(now - due);
            }
            let mut left = self.per_tick;
            while left > 0 {
                let n = left.min(rows.len() - at);
                conn.write_all(&rows[at..at + n])?;
                at = (at + n) % rows.len();
                left -= n;
            }
            k += 1;
        }
        Ok(worst)
    }
}

/// VmRSS of this process, from /proc.
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}
