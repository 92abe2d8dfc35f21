//! The prepare pipeline's stages and the bookkeeping that turns parts back into whole files.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use forte_format::manifest::CODEC_ZSTD;
use forte_format::seal::encrypt;
use forte_format::FORMAT;
use forte_format::{bundle, EdgeKey, Kind, Manifest, Member, ObjectId, PartEntry, Recipients};
use forte_pipeline::{
    queue, Budget, BufferPool, Charge, Emit, Gate, Pipeline, Salvage, Scheduling, Weigh, Work,
};
use parking_lot::{Mutex, MutexGuard};

use crate::adapt::{fill, LevelControl, Pressure};
use crate::bundle::BundleMember;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::sink::Sink;
use crate::source::SourceFile;

/// Knobs of the prepare path.
#[derive(Debug, Clone)]
pub struct PrepareConfig {
    /// Raw bytes per part: the unit of compression, encryption, transfer and retry.
    pub part_size: u64,
    /// zstd level of every part, or the first level when `adapt` is set.
    pub level: i32,
    /// Adapt the level within these bounds to the slower of CPU and sink (`--level auto`).
    pub adapt: Option<(i32, i32)>,
    /// CPU budget: the most workers hashing, compressing or encrypting at once.
    pub cpu: usize,
    /// Bytes between being read and being stored, in units of `part_size`: the memory
    /// budget, to which room for two parts is added per upload the send's tuner raises the
    /// sink's limit to beyond where it began (read as parts are read). A part counts its raw
    /// bytes until it is sealed, then twice its sealed bytes (the sink's copy). Memory stays
    /// below about `(parts_in_flight + 2 × uploads) × 2 × part_size` (raw and compressed
    /// copies of incompressible data); small files share the budget by their size.
    pub parts_in_flight: usize,
    /// Workers of the sink stage (writers or uploaders), and how many of them work at once: a
    /// limit the send's tuner changes while the pass runs.
    pub sink: Arc<Gate>,
    /// Who runs the computing stages.
    pub scheduling: Scheduling,
}

impl PrepareConfig {
    pub const DEFAULT_PART_SIZE: u64 = 16 << 20;
    pub const DEFAULT_LEVEL: i32 = 3;

    /// Defaults for this machine: all cores, and enough parts in flight to keep them busy.
    pub fn for_this_machine() -> Self {
        let cpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            part_size: Self::DEFAULT_PART_SIZE,
            level: Self::DEFAULT_LEVEL,
            adapt: None,
            cpu,
            parts_in_flight: cpu + 4,
            sink: Gate::fixed(cpu.max(2)),
            scheduling: Scheduling::default(),
        }
    }
}

/// Running totals, readable while the pipeline works (for progress bars).
#[derive(Debug, Default, Serialize)]
pub struct Totals {
    pub files_done: AtomicU64,
    pub files_failed: AtomicU64,
    /// Raw bytes of parts stored by the sink.
    pub raw_bytes: AtomicU64,
    pub compressed_bytes: AtomicU64,
    /// Bytes handed to the sink: sealed parts and manifests.
    pub sealed_bytes: AtomicU64,
    /// The zstd level the last part was compressed at.
    pub level: AtomicI32,
}

/// What became of one source file.
#[derive(Debug, Clone, Serialize)]
pub struct FileOutcome {
    pub path: String,
    pub kind: Kind,
    pub id: ObjectId,
    /// The object that carries it: its own `id`, or its bundle's.
    pub object: ObjectId,
    pub size: u64,
    /// The whole file's raw SHA-256, once its manifest is stored: what the batch's or
    /// archive's inventory lists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a file's error says when it changed while it was read ([`FileOutcome::changed_while_read`]).
const CHANGED_WHILE_READ: &str = "changed while being read";

impl FileOutcome {
    /// Whether it failed because it changed while it was read: its object is given up (the
    /// file goes again under another id, as a later version), never resumed.
    pub fn changed_while_read(&self) -> bool {
        self.error
            .as_deref()
            .is_some_and(|e| e.contains(CHANGED_WHILE_READ))
    }

    /// The inventory entry of a file whose object was stored.
    pub fn inventory_entry(&self) -> Option<forte_format::InventoryEntry> {
        Some(forte_format::InventoryEntry {
            id: self.id,
            path: self.path.clone(),
            size: self.size,
            sha256: self.sha256.clone().filter(|_| self.error.is_none())?,
        })
    }
}

/// A part the destination already holds (found when resuming): it is read and hashed again,
/// for the whole-file hash, but not compressed, encrypted or sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldPart {
    pub ciphertext_sha256: String,
    pub ciphertext_length: u64,
}

/// Where a batch's objects come from, as their manifests sign it (format 4): the site they
/// are sealed for and when the batch arrived at the edge. Empty for `forte pack`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    pub site: String,
    /// Seconds since the Unix epoch.
    pub batch_time: i64,
}

/// One file to prepare, under the object id it will have.
#[derive(Debug, Clone)]
pub struct PrepareJob {
    pub source: SourceFile,
    pub id: ObjectId,
    /// The batch name recorded in the manifest.
    pub batch: String,
    pub origin: Origin,
    /// Parts the sink already holds, by index.
    pub held: BTreeMap<u32, HeldPart>,
    /// A bundle's files ([`crate::bundle_small`]); empty for a file or directory.
    pub members: Vec<BundleMember>,
    /// The raw bytes per part this object is cut into, when the sender chose them (the size
    /// its held parts were cut at; smaller parts for the last objects of a queue); else the
    /// pass's. A bundle is always one part.
    pub part_size: Option<u64>,
}

impl PrepareJob {
    /// A file to prepare from scratch as object `id` of `batch`.
    pub fn new(source: SourceFile, id: ObjectId, batch: &str) -> Self {
        Self {
            source,
            id,
            batch: batch.to_owned(),
            origin: Origin::default(),
            held: BTreeMap::new(),
            members: Vec::new(),
            part_size: None,
        }
    }

    /// The job, its manifest naming `origin`.
    pub fn from_origin(self, origin: Origin) -> Self {
        Self { origin, ..self }
    }

    /// A file prepared from scratch under a new random id, in no batch.
    pub fn fresh(source: SourceFile) -> Self {
        Self::new(source, ObjectId::random(), "")
    }

    /// The raw bytes of the files it carries (a bundle's tar stream is larger by its headers).
    pub fn file_bytes(&self) -> u64 {
        self.files().iter().map(|(source, _)| source.size).sum()
    }

    /// The files of this job with their ids: a bundle's members, or the file itself.
    pub fn files(&self) -> Vec<(&SourceFile, ObjectId)> {
        if self.members.is_empty() {
            return vec![(&self.source, self.id)];
        }
        self.members.iter().map(|m| (&m.source, m.id)).collect()
    }

    /// The outcome of each of [`PrepareJob::files`] when it failed with `error`.
    pub fn unfinished(&self, error: &str) -> Vec<FileOutcome> {
        self.files()
            .into_iter()
            .map(|(source, id)| FileOutcome {
                path: source.path.clone(),
                kind: source.kind,
                id,
                object: self.id,
                size: source.size,
                sha256: None,
                error: Some(error.to_string()),
            })
            .collect()
    }
}

/// Where a prepare pass takes its files from, one at a time; `None` ends the pass.
pub trait JobQueue: Sync {
    fn next(&self) -> Option<PrepareJob>;
}

impl<I: Iterator<Item = PrepareJob> + Send> JobQueue for Mutex<I> {
    fn next(&self) -> Option<PrepareJob> {
        self.lock().next()
    }
}

/// One prepare run: its configuration, keys, and live counters.
pub struct Prepare<'k> {
    config: PrepareConfig,
    recipients: &'k Recipients,
    key: &'k EdgeKey,
    /// Stage counters, readable from another thread while [`Prepare::run`] works.
    pub pipeline: Pipeline,
    pub totals: Arc<Totals>,
}

/// A file on its way through the pipeline, shared by all its pieces.
struct FileJob {
    source: SourceFile,
    id: ObjectId,
    batch: String,
    origin: Origin,
    held: BTreeMap<u32, HeldPart>,
    members: Vec<BundleMember>,
    part_size: u64,
    parts: u32,
    state: Mutex<FileState>,
}

#[derive(Default)]
struct FileState {
    /// The whole-file hash, fed part by part in order by the single `hash` worker.
    whole: Option<Sha256>,
    sha256: Option<String>,
    entries: Vec<Option<PartEntry>>,
    hashed: u32,
    /// Pieces that reached the sink, counted in units of [`FileJob::units`].
    accounted: u32,
    manifest: Option<SealedManifest>,
    /// The manifest went to the sink with the only part ([`Sink::put_object`]).
    manifest_stored: bool,
    error: Option<String>,
    /// A bundle's members' SHA-256, in order, from the `hash` stage.
    member_sha256: Vec<String>,
}

impl FileJob {
    fn new(job: PrepareJob, part_size: u64) -> Self {
        let PrepareJob {
            source,
            id,
            batch,
            origin,
            held,
            members,
            part_size: chosen,
        } = job;
        // A bundle is one part, however large: each part must be a whole tar stream.
        let part_size = if members.is_empty() {
            chosen.unwrap_or(part_size).max(1)
        } else {
            source.size.max(1)
        };
        let parts =
            u32::try_from(source.size.div_ceil(part_size)).expect("a file of over 2^32 parts");
        Self {
            id,
            batch,
            origin,
            held,
            members,
            part_size,
            parts,
            state: Mutex::new(FileState {
                entries: vec![None; parts as usize],
                whole: (parts > 1).then(Sha256::new),
                ..FileState::default()
            }),
            source,
        }
    }

    /// How many units of work the sink must see before the file is settled: one per part, or
    /// one for a file without parts (empty file, directory).
    fn units(&self) -> u32 {
        self.parts.max(1)
    }

    fn lock(&self) -> MutexGuard<'_, FileState> {
        self.state.lock()
    }
}

impl Weigh for FileJob {
    /// A file, or a bundle of small ones.
    const ITEM: &'static str = "object";

    fn weight(&self) -> u64 {
        self.source.size
    }
}

enum Body {
    /// Part `index`; `data` holds raw bytes, then compressed, then sealed bytes.
    Part {
        index: u32,
        data: Vec<u8>,
        raw_len: u64,
        compressed_len: u64,
        /// The zstd level it was compressed at.
        level: i32,
    },
    /// Part `index`, already held by the sink: hashed, then passed through.
    Held {
        index: u32,
        raw_len: u64,
        sealed: HeldPart,
    },
    /// The only piece of a file without parts.
    Whole,
    /// The file failed; this piece stands for `covers` units that will never arrive.
    Failed { covers: u32, error: String },
}

/// A file's manifest, and the same signed and sealed for the core: what the sink stores.
struct SealedManifest {
    manifest: Manifest,
    sealed: Vec<u8>,
}

/// A part's length before compression and after it (before the seal).
#[derive(Clone, Copy)]
struct PartLengths {
    raw: u64,
    compressed: u64,
}

struct Piece {
    file: Arc<FileJob>,
    body: Body,
    /// Set by `seal` on the piece that completed the file.
    manifest: Option<SealedManifest>,
    /// This piece's share of the memory budget, held until the sink is done with it.
    charge: Option<Charge>,
    /// When its bytes were read (a part's), for its latency to the sink.
    read_at: Option<Instant>,
}

impl Weigh for Piece {
    const ITEM: &'static str = "part";

    fn weight(&self) -> u64 {
        match &self.body {
            Body::Part { data, .. } => data.len() as u64,
            _ => 0,
        }
    }

    fn read_at(&self) -> Option<Instant> {
        self.read_at
    }
}

/// A piece whose worker died goes on as a failure of its file (and part), covering what it
/// covered.
impl Salvage for Piece {
    type Remains = (Arc<FileJob>, Option<u32>, u32);

    fn remains(&self) -> Self::Remains {
        let (part, covers) = match &self.body {
            Body::Part { index, .. } | Body::Held { index, .. } => (Some(*index), 1),
            Body::Whole => (None, 1),
            Body::Failed { covers, .. } => (None, *covers),
        };
        (self.file.clone(), part, covers)
    }

    fn lost((file, part, covers): Self::Remains, error: String) -> Self {
        let error = match part {
            Some(index) => format!("part {index}: {error}"),
            None => error,
        };
        Self {
            file,
            body: Body::Failed { covers, error },
            manifest: None,
            charge: None,
            read_at: None,
        }
    }
}

impl Piece {
    /// Part `index` of `file` as read: raw bytes holding their share of the memory budget.
    fn read(file: Arc<FileJob>, index: u32, data: Vec<u8>, charge: Charge) -> Self {
        Self {
            file,
            body: Body::Part {
                index,
                raw_len: data.len() as u64,
                data,
                compressed_len: 0,
                level: 0,
            },
            manifest: None,
            charge: Some(charge),
            read_at: Some(Instant::now()),
        }
    }

    fn fail(&mut self, error: String) {
        self.body = Body::Failed { covers: 1, error };
    }
}

/// Buffers of at least this size are recycled through [`BufferPool`]s.
const POOLED_BUFFER: usize = 1 << 20;

/// The least a piece charges the memory budget: its bookkeeping costs something even when the
/// file is tiny.
const MIN_CHARGE: u64 = 4096;

/// Granularity at which hashers fed together take turns (see [`hash_part`]).
const INTERLEAVED_HASH_BLOCK: usize = 64;

/// Recycled buffers for each representation of a part.
struct Pools {
    raw: BufferPool,
    compressed: BufferPool,
    sealed: BufferPool,
}

thread_local! {
    /// One zstd context per compress worker, reused across parts: creating one per part costs
    /// more than compressing a small file.
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
}

fn compress(level: i32, raw: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
    COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|(l, _)| *l != level) {
            *cell = Some((level, zstd::bulk::Compressor::new(level)?));
        }
        let (_, compressor) = cell.as_mut().expect("set above");
        compressor.compress_to_buffer(raw, out).map(|_| ())
    })
}

impl<'k> Prepare<'k> {
    pub fn new(config: PrepareConfig, recipients: &'k Recipients, key: &'k EdgeKey) -> Self {
        let pipeline = Pipeline::new(Budget::new(config.cpu as u64), config.scheduling);
        Self {
            config,
            recipients,
            key,
            pipeline,
            totals: Arc::default(),
        }
    }

    /// Prepares every file and hands the results to `sink`. Returns one outcome per file, in
    /// the order the files were given. A failing file does not stop the others, except that a
    /// sink failure (disk full, relay gone) stops reading new files.
    pub fn run(&self, files: Vec<PrepareJob>, sink: &dyn Sink) -> Vec<FileOutcome> {
        let unfinished: Vec<FileOutcome> = files
            .iter()
            .flat_map(|f| f.unfinished("not prepared: an earlier failure stopped the pass"))
            .collect();
        let mut outcomes: std::collections::HashMap<ObjectId, FileOutcome> = self
            .pass(&Mutex::new(files.into_iter()), sink, true)
            .into_iter()
            .map(|o| (o.id, o))
            .collect();
        unfinished
            .into_iter()
            .map(|u| outcomes.remove(&u.id).unwrap_or(u))
            .collect()
    }

    /// Prepares files as `jobs` hands them out, until it has no more, and hands the results
    /// to `sink`, whose [`Sink::done`] hears each file's outcome. The next file is asked for
    /// only when the read stage is free, so the queue decides the order as late as possible.
    pub fn run_from(&self, jobs: &dyn JobQueue, sink: &dyn Sink) {
        self.pass(jobs, sink, false);
    }

    /// [`Prepare::run_from`], returning the outcomes in the order the files finished if
    /// `keep_outcomes` (a daemon's endless queue would otherwise keep one per file it ever sent).
    fn pass(&self, jobs: &dyn JobQueue, sink: &dyn Sink, keep_outcomes: bool) -> Vec<FileOutcome> {
        let cfg = &self.config;
        let cpu = cfg.cpu.max(1);
        let pass = Pass::new(cfg, sink);
        // Queues bound item counts; bytes are bounded by the memory budget. Room for several
        // items keeps every stage fed when files are small.
        let depth = 4 * cpu + 4;
        // One file waits for the reader: the queue's choice is made as late as possible.
        let (jobs_tx, jobs_rx) = queue::<Arc<FileJob>>(1);
        let (read_tx, read_rx) = queue::<Piece>(depth);
        let (hash_tx, hash_rx) = queue::<Piece>(depth);
        let (compress_tx, compress_rx) = queue::<Piece>(depth);
        let (encrypt_tx, encrypt_rx) = queue::<Piece>(depth);
        let (hashed_tx, hashed_rx) = queue::<Piece>(depth);
        let (seal_tx, seal_rx) = queue::<Piece>(depth);
        let p = &self.pipeline;
        p.run(|s| {
            s.io("read", 1, jobs_rx, read_tx, |job, emit| {
                read_file(job, &pass, emit)
            });
            // One file's parts are hashed in order, one at a time; every stage after `hash`
            // runs on as many workers as the CPU budget allows.
            s.cpu("hash", 1, read_rx, hash_tx, in_place(hash_raw));
            let compress = in_place(|piece| self.compress_part(piece, &pass));
            s.cpu("compress", cpu, hash_rx, compress_tx, compress);
            let encrypt = in_place(|piece| self.encrypt_part(piece, &pass));
            s.cpu("encrypt", cpu, compress_rx, encrypt_tx, encrypt);
            let hash_sealed = in_place(|piece| hash_ciphertext(piece));
            s.cpu("hash_ciphertext", cpu, encrypt_rx, hashed_tx, hash_sealed);
            let seal = in_place(|piece| self.seal_if_complete(piece));
            s.cpu("seal", cpu, hashed_rx, seal_tx, seal);
            s.sink("sink", cfg.sink.clone(), seal_rx, |piece| {
                let outcomes = self.store(piece, &pass);
                if !outcomes.is_empty() {
                    sink.done(&outcomes);
                    if keep_outcomes {
                        pass.outcomes.lock().extend(outcomes);
                    }
                }
            });
            while pass.stop.get().is_none() {
                let Some(job) = jobs.next() else { break };
                let job = Arc::new(FileJob::new(job, pass.part_size));
                if jobs_tx.send(job).is_err() {
                    break;
                }
            }
            drop(jobs_tx);
        });
        pass.outcomes.into_inner()
    }

    /// The `compress` stage: zstd at the level the controller sets now, which then hears how
    /// full the queues around it are.
    fn compress_part(&self, piece: &mut Piece, pass: &Pass) {
        let Body::Part {
            data,
            compressed_len,
            index,
            level,
            ..
        } = &mut piece.body
        else {
            return;
        };
        let bound = zstd::zstd_safe::compress_bound(data.len());
        let mut out = pass.pools.compressed.take(bound);
        *level = pass.levels.current();
        self.totals.level.store(*level, Ordering::Relaxed);
        match compress(*level, data, &mut out) {
            Ok(()) => {
                *compressed_len = out.len() as u64;
                pass.pools.raw.give(std::mem::replace(data, out));
                pass.levels.observe(|| self.pressure());
            }
            Err(e) => {
                let error = format!("part {index}: compression failed: {e}");
                piece.fail(error);
            }
        }
    }

    /// The `encrypt` stage: each part in an age envelope to the core's recipients.
    fn encrypt_part(&self, piece: &mut Piece, pass: &Pass) {
        if let Body::Part {
            data,
            index,
            raw_len,
            ..
        } = &mut piece.body
        {
            let mut sealed = pass.pools.sealed.take(data.len() + data.len() / 4096 + 512);
            encrypt(&self.recipients.0, data, &mut sealed);
            pass.sink
                .prepared(piece.file.id, *index, *raw_len, sealed.len() as u64);
            // From here a file's part is its sealed buffer (a recycled one may be larger than
            // its bytes) and, while a sink sends it, the sink's copy: less than the raw bytes
            // when they compressed. The rest of its charge lets the next parts be read while
            // this one waits for the sink (on a long link, a round trip per upload). A bundle
            // keeps its charge: its members' bookkeeping, which the charge does not count,
            // grew the peak of 100 000 small files by 50 MiB when more bundles waited.
            if let Some(charge) = piece
                .charge
                .as_mut()
                .filter(|_| piece.file.members.is_empty())
            {
                charge.shrink_to((2 * sealed.capacity() as u64).max(MIN_CHARGE));
            }
            pass.pools.compressed.give(std::mem::replace(data, sealed));
        }
    }

    /// How full the queue before the sink is, and how long the computing stages were busy.
    ///
    /// Against the most parts that can wait there: the memory budget (`parts_in_flight`)
    /// holds fewer parts than a queue has room for, so a queue's capacity is never reached.
    fn pressure(&self) -> Pressure {
        let stages = self.pipeline.snapshot();
        let waiting_for_sink = stages.iter().find(|s| s.name == "sink").map_or(0.0, |s| {
            fill(s.queue_depth, s.queue_capacity, self.config.parts_in_flight)
        });
        Pressure {
            waiting_for_sink,
            cpu_busy_seconds: stages
                .iter()
                .filter(|s| s.work == Work::Cpu)
                .map(|s| s.busy_seconds)
                .sum(),
        }
    }

    /// Builds, signs and encrypts the manifest once the last part of the file was hashed.
    fn seal_if_complete(&self, piece: &mut Piece) {
        let complete = match piece.body {
            Body::Failed { .. } => false,
            Body::Whole => true,
            Body::Part { .. } | Body::Held { .. } => {
                let mut state = piece.file.lock();
                state.hashed += 1;
                state.hashed == piece.file.parts
            }
        };
        if !complete {
            return;
        }
        let job = &piece.file;
        let (sha256, parts) = {
            let state = job.lock();
            let parts: Option<Vec<PartEntry>> = state.entries.iter().cloned().collect();
            (state.sha256.clone(), parts)
        };
        let (Some(sha256), Some(parts)) = (sha256, parts) else {
            piece.fail("internal error: file complete without all hashes".into());
            return;
        };
        let src = &job.source;
        let members = bundle_members(job, &piece.file.lock().member_sha256);
        let manifest = Manifest {
            format: FORMAT.into(),
            id: job.id,
            batch: job.batch.clone(),
            path: src.path.clone(),
            kind: src.kind,
            size: src.size,
            mode: src.mode,
            mtime_s: src.mtime_s,
            mtime_ns: src.mtime_ns,
            sha256,
            part_size: job.part_size,
            parts,
            members,
            site: job.origin.site.clone(),
            batch_time: job.origin.batch_time,
        };
        let document = manifest.sign(self.key);
        let mut sealed = Vec::with_capacity(document.len() + 512);
        encrypt(&self.recipients.0, &document, &mut sealed);
        piece.manifest = Some(SealedManifest { manifest, sealed });
    }

    /// Hands a piece to the sink and settles its file once every unit arrived. Returns the
    /// outcomes of the file (or the bundle's files) when this piece settled it.
    fn store(&self, piece: Piece, pass: &Pass) -> Vec<FileOutcome> {
        let Piece {
            file,
            body,
            mut manifest,
            charge,
            read_at: _,
        } = piece;
        let already_failed = file.lock().error.is_some();
        let (covers, error) = match body {
            Body::Failed { covers, error } => (covers, Some(error)),
            Body::Whole => (1, None),
            Body::Part { .. } if already_failed => (1, None),
            Body::Held { raw_len, .. } => {
                self.totals.raw_bytes.fetch_add(raw_len, Ordering::Relaxed);
                (1, None)
            }
            Body::Part {
                index,
                data,
                raw_len,
                compressed_len,
                ..
            } => {
                let lengths = PartLengths {
                    raw: raw_len,
                    compressed: compressed_len,
                };
                let stored = match manifest.take() {
                    // A one-part file's only piece carries its manifest: both go together.
                    Some(whole) if file.parts == 1 => {
                        self.put_object(&file, data, lengths, whole, pass)
                    }
                    other => {
                        manifest = other;
                        self.put_part(&file, index, data, lengths, pass)
                    }
                };
                (1, stored.err())
            }
        };
        drop(charge);
        let mut state = file.lock();
        if let Some(error) = error {
            state.error.get_or_insert(error);
        }
        if manifest.is_some() {
            state.manifest = manifest;
        }
        state.accounted += covers;
        if state.accounted < file.units() {
            return Vec::new();
        }
        self.settle(&file, &mut state, pass)
    }

    /// Stores a one-part file's part and manifest together ([`Sink::put_object`]) and counts
    /// their bytes, like [`Prepare::put_part`] and the manifest's share of [`Prepare::settle`].
    fn put_object(
        &self,
        file: &FileJob,
        data: Vec<u8>,
        lengths: PartLengths,
        whole: SealedManifest,
        pass: &Pass,
    ) -> Result<(), String> {
        let SealedManifest {
            manifest,
            sealed: sealed_manifest,
        } = whole;
        let sha256 = manifest.parts[0].ciphertext_sha256.clone();
        let stored = pass
            .sink
            .put_object(&manifest, &data, &sha256, &sealed_manifest);
        let sealed_len = (data.len() + sealed_manifest.len()) as u64;
        pass.pools.sealed.give(data);
        if let Err(e) = stored {
            return Err(pass.stop_at(file, format!("part 0 and manifest: {e:#}")));
        }
        file.lock().manifest_stored = true;
        self.count_stored(lengths, sealed_len);
        Ok(())
    }

    fn count_stored(&self, lengths: PartLengths, sealed_len: u64) {
        let t = &self.totals;
        t.raw_bytes.fetch_add(lengths.raw, Ordering::Relaxed);
        t.compressed_bytes
            .fetch_add(lengths.compressed, Ordering::Relaxed);
        t.sealed_bytes.fetch_add(sealed_len, Ordering::Relaxed);
    }

    /// Stores one sealed part and counts its bytes (raw and compressed lengths in `lengths`).
    /// A sink that fails stops the pass: the next parts would fail the same way.
    fn put_part(
        &self,
        file: &FileJob,
        index: u32,
        data: Vec<u8>,
        lengths: PartLengths,
        pass: &Pass,
    ) -> Result<(), String> {
        let sha256 = file.lock().entries[index as usize]
            .as_ref()
            .map(|e| e.ciphertext_sha256.clone())
            .unwrap_or_default();
        let stored = pass
            .sink
            .put_part(file.id, index, file.part_size, &data, &sha256);
        let sealed_len = data.len() as u64;
        pass.pools.sealed.give(data);
        if let Err(e) = stored {
            return Err(pass.stop_at(file, format!("part {index}: {e:#}")));
        }
        self.count_stored(lengths, sealed_len);
        Ok(())
    }

    /// Finishes a file whose every piece reached the sink: stores its manifest unless the
    /// file failed, and counts it (a bundle: each of its files).
    fn settle(&self, file: &FileJob, state: &mut FileState, pass: &Pass) -> Vec<FileOutcome> {
        let mut sha256 = None;
        if state.error.is_none() && state.manifest_stored {
            sha256 = state.sha256.clone();
        } else if state.error.is_none() {
            let SealedManifest { manifest, sealed } = state
                .manifest
                .take()
                .expect("the last hashed piece carries it");
            match pass.sink.put_manifest(&manifest, &sealed) {
                Ok(()) => {
                    sha256 = Some(manifest.sha256);
                    self.totals
                        .sealed_bytes
                        .fetch_add(sealed.len() as u64, Ordering::Relaxed);
                }
                Err(e) => state.error = Some(pass.stop_at(file, format!("manifest: {e:#}"))),
            }
        }
        let error = state.error.take();
        let files = file.members.len().max(1) as u64;
        let counter = match error {
            Some(_) => &self.totals.files_failed,
            None => &self.totals.files_done,
        };
        counter.fetch_add(files, Ordering::Relaxed);
        let outcome = |source: &SourceFile, id, sha256| FileOutcome {
            path: source.path.clone(),
            kind: source.kind,
            id,
            object: file.id,
            size: source.size,
            sha256,
            error: error.clone(),
        };
        if file.members.is_empty() {
            return vec![outcome(&file.source, file.id, sha256)];
        }
        let hashes = std::mem::take(&mut state.member_sha256);
        file.members
            .iter()
            .zip(hashes.into_iter().map(Some).chain(std::iter::repeat(None)))
            .map(|(m, sha)| outcome(&m.source, m.id, sha.filter(|_| error.is_none())))
            .collect()
    }
}

/// What the stages of one pass share.
struct Pass<'s> {
    part_size: u64,
    /// Bytes between being read and being stored (raw, then sealed).
    memory: Arc<Budget>,
    /// The memory budget's base, in parts (`parts_in_flight`), before the uploads' room.
    parts_in_flight: u64,
    /// The uploads the base already leaves room for: the sink's limit as the pass began (a
    /// fixed `--connections`, or where an untuned sender starts), or the parts beyond one per
    /// computing worker if more.
    sink_room: u64,
    /// The sink's gate, whose limit (uploads in flight) grows the memory budget.
    sink_gate: Arc<Gate>,
    pools: Pools,
    levels: LevelControl,
    /// Why the pass stopped reading new files, once something failed that would fail them
    /// all (the sink).
    stop: OnceLock<String>,
    outcomes: Mutex<Vec<FileOutcome>>,
    sink: &'s dyn Sink,
}

impl<'s> Pass<'s> {
    fn new(cfg: &PrepareConfig, sink: &'s dyn Sink) -> Self {
        let part_size = cfg.part_size.max(1);
        let cpu = cfg.cpu.max(1);
        Self {
            part_size,
            memory: Budget::new(cfg.parts_in_flight.max(1) as u64 * part_size),
            parts_in_flight: cfg.parts_in_flight.max(1) as u64,
            sink_room: cfg
                .parts_in_flight
                .saturating_sub(cpu)
                .max(cfg.sink.limit()) as u64,
            sink_gate: cfg.sink.clone(),
            pools: Pools {
                raw: BufferPool::new(cpu, POOLED_BUFFER),
                compressed: BufferPool::new(cpu, POOLED_BUFFER),
                sealed: BufferPool::new(cpu, POOLED_BUFFER),
            },
            levels: LevelControl::new(cfg.level, cfg.adapt, cfg.cpu),
            stop: OnceLock::new(),
            outcomes: Mutex::default(),
            sink,
        }
    }

    /// Waits for `units` of the memory budget, grown first by room for each upload the tuner
    /// has raised the sink to beyond the base's room (a sealed part is charged twice its
    /// size, see `encrypt_part`): on a long link every upload holds its part for a round trip
    /// or more, and a budget that did not follow the tuner's uploads left them without parts
    /// (600 ms: 19 of 64 uploads busy, the link a third full). Uploads the tuner did not ask
    /// for get no room: under a bandwidth limit, parts all sent at once share it and all
    /// finish at the end, and no progress shows until then. Never shrunk: what is held stays
    /// held.
    fn charge(&self, units: u64) -> Charge {
        let uploads = self.sink_gate.limit() as u64;
        let more = 2 * uploads.saturating_sub(self.sink_room);
        self.memory
            .grow_to((self.parts_in_flight + more) * self.part_size);
        self.memory.charge(units)
    }

    /// Stops the pass because of `file`'s `error`, and returns the error.
    fn stop_at(&self, file: &FileJob, error: String) -> String {
        let _ = self.stop.set(format!("{}: {error}", file.source.path));
        error
    }
}

/// A stage's work that changes each piece in place and passes it on.
fn in_place<'w>(
    work: impl Fn(&mut Piece) + Send + Sync + 'w,
) -> impl Fn(Piece, &mut Emit<'_, Piece>) + Send + Sync + 'w {
    move |mut piece, emit| {
        work(&mut piece);
        emit.send(piece);
    }
}

/// The `read` stage: reads a file once, part by part, each into its own buffer. Checks that the
/// file did not change while it was read before letting its last part go.
fn read_file(job: Arc<FileJob>, pass: &Pass, emit: &mut Emit<'_, Piece>) {
    let failed = |emitted: u32, error: String| Piece {
        body: Body::Failed {
            covers: job.units() - emitted,
            error,
        },
        file: job.clone(),
        manifest: None,
        charge: None,
        read_at: None,
    };
    if let Some(why) = pass.stop.get() {
        emit.send(failed(
            0,
            format!("not prepared: stopped after an earlier error ({why})"),
        ));
        return;
    }
    if job.parts == 0 {
        emit.send(Piece {
            file: job.clone(),
            body: Body::Whole,
            manifest: None,
            charge: None,
            read_at: None,
        });
        return;
    }
    if !job.members.is_empty() {
        emit.wait_for_demand();
        let charge = emit.waiting(|| pass.charge(job.source.size.max(MIN_CHARGE)));
        emit.send(match read_bundle(&job, pass) {
            Ok(data) => Piece::read(job.clone(), 0, data, charge),
            Err(error) => failed(0, error),
        });
        return;
    }
    let src = &job.source;
    let mut file = match File::open(&src.local) {
        Ok(f) => f,
        Err(e) => {
            emit.send(failed(
                0,
                format!("cannot open {}: {e}", src.local.display()),
            ));
            return;
        }
    };
    for index in 0..job.parts {
        let offset = u64::from(index) * job.part_size;
        let len = job.part_size.min(src.size - offset);
        emit.wait_for_demand();
        let charge = emit.waiting(|| pass.charge(len.max(MIN_CHARGE)));
        if let Some(why) = pass.stop.get() {
            emit.send(failed(
                index,
                format!("stopped after an earlier error ({why})"),
            ));
            return;
        }
        let data = match read_part(&mut file, &job, index, len, &pass.pools.raw) {
            Ok(data) => data,
            Err(error) => {
                emit.send(failed(index, error));
                return;
            }
        };
        let piece = Piece::read(job.clone(), index, data, charge);
        if !emit.send(piece) {
            return;
        }
    }
}

/// Reads part `index`, `len` bytes long. After the last part, checks that the file is as it
/// was listed, and drops it from the page cache: each source byte is read once.
fn read_part(
    file: &mut File,
    job: &FileJob,
    index: u32,
    len: u64,
    buffers: &BufferPool,
) -> Result<Vec<u8>, String> {
    let src = &job.source;
    let mut data = buffers.take(len as usize);
    append_exactly(file, src, len, &mut data).map_err(|e| format!("part {index}: {e}"))?;
    if index + 1 == job.parts {
        unchanged_since_listing(file, src)?;
        forte_fs::drop_from_cache(file);
    }
    Ok(data)
}

/// Appends the next `len` bytes of `src`'s open `file` to `data`; fewer means it shrank.
fn append_exactly(
    file: &mut File,
    src: &SourceFile,
    len: u64,
    data: &mut Vec<u8>,
) -> Result<(), String> {
    let read = file
        .take(len)
        .read_to_end(data)
        .map_err(|e| format!("cannot read {}: {e}", src.local.display()))?;
    if read as u64 != len {
        return Err(format!(
            "{} shrank while being read; send it again once it is complete",
            src.local.display()
        ));
    }
    Ok(())
}

/// Reads a bundle's members, each once, into one tar stream: header, bytes, padding; then the
/// end of the archive. Each member is checked unchanged since it was listed, like a file.
fn read_bundle(job: &FileJob, pass: &Pass) -> Result<Vec<u8>, String> {
    let mut data = pass.pools.raw.take(job.source.size as usize);
    for member in &job.members {
        let src = &member.source;
        data.extend_from_slice(&bundle::header(&src.path, src.size, src.mode, src.mtime_s));
        if data.len() as u64 != member.offset {
            return Err(format!(
                "internal error: {} starts at byte {} of bundle {}, planned {}",
                src.path,
                data.len(),
                job.id,
                member.offset
            ));
        }
        let mut file = File::open(&src.local)
            .map_err(|e| format!("cannot open {}: {e}", src.local.display()))?;
        append_exactly(&mut file, src, src.size, &mut data)?;
        unchanged_since_listing(&file, src)?;
        forte_fs::drop_from_cache(&file);
        data.resize(bundle::padded(data.len() as u64) as usize, 0);
    }
    data.resize(data.len() + bundle::END_OF_ARCHIVE as usize, 0);
    if data.len() as u64 != job.source.size {
        return Err(format!(
            "internal error: bundle {} is {} bytes, planned {}",
            job.id,
            data.len(),
            job.source.size
        ));
    }
    Ok(data)
}

/// The manifest's members of a bundle job, with the hashes the `hash` stage found.
fn bundle_members(job: &FileJob, sha256: &[String]) -> Vec<Member> {
    job.members
        .iter()
        .zip(sha256)
        .map(|(m, sha256)| {
            let src = &m.source;
            Member {
                id: m.id,
                path: src.path.clone(),
                size: src.size,
                mode: src.mode,
                mtime_s: src.mtime_s,
                mtime_ns: src.mtime_ns,
                offset: m.offset,
                sha256: sha256.clone(),
            }
        })
        .collect()
}

fn unchanged_since_listing(file: &File, src: &SourceFile) -> Result<(), String> {
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat {}: {e}", src.local.display()))?;
    if meta.len() != src.size
        || meta.mtime() != src.mtime_s
        || meta.mtime_nsec() as u32 != src.mtime_ns
    {
        return Err(format!(
            "{} {CHANGED_WHILE_READ}; send it again once it is complete",
            src.local.display()
        ));
    }
    Ok(())
}

/// The `hash` stage: SHA-256 of each raw part, of the whole file in part order, and of each
/// member of a bundle. A file of one part is hashed once, its part hash being the file hash.
fn hash_raw(piece: &mut Piece) {
    let file = &piece.file;
    match &piece.body {
        Body::Part { index, data, .. } => {
            // The whole-file hasher leaves the lock while it works, so other stages can record
            // this file's finished parts meanwhile. Only this stage's single worker touches it.
            let mut whole = file.lock().whole.take();
            let (part_hash, members) = hash_part(data, whole.as_mut(), &file.members);
            let mut state = file.lock();
            state.member_sha256 = members;
            if *index + 1 == file.parts {
                state.sha256 = Some(match whole {
                    Some(whole) => hex::encode(whole.finalize()),
                    None => part_hash.clone(),
                });
            } else {
                state.whole = whole;
            }
            state.entries[*index as usize] = Some(PartEntry {
                index: *index,
                raw_offset: u64::from(*index) * file.part_size,
                raw_length: data.len() as u64,
                raw_sha256: part_hash,
                ciphertext_length: 0,
                ciphertext_sha256: String::new(),
                codec: CODEC_ZSTD.into(),
                level: 0,
            });
            drop(state);
            if let Some(sealed) = file.held.get(index) {
                piece.body = Body::Held {
                    index: *index,
                    raw_len: data.len() as u64,
                    sealed: sealed.clone(),
                };
            }
        }
        Body::Held { .. } => unreachable!("parts become held in this stage"),
        Body::Whole => file.lock().sha256 = Some(hex::encode(Sha256::digest([]))),
        Body::Failed { .. } => {}
    }
}

/// One pass over a raw part `data`: its SHA-256, fed also to `whole` (the file's hasher, when
/// the file has several parts) and, for a bundle's tar stream, each member's bytes to a hasher
/// of its own. Returns the part's hash and the members' (none for a file), in order.
///
/// Hashers fed together take turns block by block, which lets the CPU overlap their SHA-NI
/// dependency chains: about 1.3× the speed of a pass per hash.
fn hash_part(
    data: &[u8],
    mut whole: Option<&mut Sha256>,
    members: &[BundleMember],
) -> (String, Vec<String>) {
    let mut part = Sha256::new();
    let mut feed = |bytes: &[u8], mut member: Option<&mut Sha256>| {
        if whole.is_none() && member.is_none() {
            part.update(bytes);
            return;
        }
        for block in bytes.chunks(INTERLEAVED_HASH_BLOCK) {
            part.update(block);
            if let Some(whole) = whole.as_deref_mut() {
                whole.update(block);
            }
            if let Some(member) = member.as_deref_mut() {
                member.update(block);
            }
        }
    };
    // Tar headers and padding go to the part's hash alone.
    let mut hashed = 0;
    let mut member_hashes = Vec::with_capacity(members.len());
    for m in members {
        let (start, end) = (m.offset as usize, (m.offset + m.source.size) as usize);
        feed(&data[hashed..start], None);
        let mut member = Sha256::new();
        feed(&data[start..end], Some(&mut member));
        member_hashes.push(hex::encode(member.finalize()));
        hashed = end;
    }
    feed(&data[hashed..], None);
    (hex::encode(part.finalize()), member_hashes)
}

/// The `hash_ciphertext` stage: completes the part's manifest entry with the hash and length of
/// its sealed bytes.
fn hash_ciphertext(piece: &Piece) {
    let (index, sha256, length, level) = match &piece.body {
        Body::Part {
            index, data, level, ..
        } => (
            *index,
            hex::encode(Sha256::digest(data)),
            data.len() as u64,
            *level,
        ),
        // Already at the sink from an earlier run, at a level this run does not know.
        Body::Held { index, sealed, .. } => (
            *index,
            sealed.ciphertext_sha256.clone(),
            sealed.ciphertext_length,
            0,
        ),
        _ => return,
    };
    let mut state = piece.file.lock();
    let entry = state.entries[index as usize]
        .as_mut()
        .expect("hashed before");
    entry.ciphertext_sha256 = sha256;
    entry.ciphertext_length = length;
    entry.level = level;
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::PathBuf;
    use std::time::{Duration, SystemTime};

    use super::*;

    /// A file as listed, and the directory holding it.
    fn listed(bytes: &[u8]) -> (tempfile::TempDir, SourceFile) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("data.bin"), bytes).unwrap();
        let mut found = crate::discover(dir.path()).unwrap();
        assert_eq!(found.files.len(), 1);
        (dir, found.files.remove(0))
    }

    #[test]
    fn one_pass_gives_each_hash_as_separate_digests_would() {
        let sha = |bytes: &[u8]| hex::encode(Sha256::digest(bytes));
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        // A bundle's tar stream: members between headers and padding, one of them empty.
        let member = |offset: u64, size: u64| BundleMember {
            source: SourceFile {
                local: PathBuf::new(),
                path: format!("m{offset}"),
                kind: Kind::File,
                size,
                mode: 0o644,
                mtime_s: 0,
                mtime_ns: 0,
            },
            id: ObjectId::random(),
            offset,
        };
        let members = [member(512, 1000), member(2048, 0), member(2560, 7000)];
        let (part, hashes) = hash_part(&data, None, &members);
        assert_eq!(part, sha(&data));
        assert_eq!(
            hashes,
            [sha(&data[512..1512]), sha(&[]), sha(&data[2560..9560])]
        );
        // A part of a file of several parts also feeds the whole-file hash.
        let mut whole = Sha256::new();
        whole.update(b"the part before");
        let (part, hashes) = hash_part(&data, Some(&mut whole), &[]);
        assert_eq!(part, sha(&data));
        assert!(hashes.is_empty());
        assert_eq!(
            hex::encode(whole.finalize()),
            sha(&[b"the part before".as_slice(), &data].concat())
        );
    }

    #[test]
    fn a_file_as_listed_is_unchanged() {
        let (_dir, src) = listed(b"steady");
        let file = File::open(&src.local).unwrap();
        assert_eq!(unchanged_since_listing(&file, &src), Ok(()));
    }

    #[test]
    fn a_new_mtime_alone_is_a_change_naming_the_file() {
        let (_dir, src) = listed(b"same bytes");
        let file = File::open(&src.local).unwrap();
        // Same size, another modification time (through the open file: fstat sees it).
        File::options()
            .write(true)
            .open(&src.local)
            .unwrap()
            .set_modified(SystemTime::now() + Duration::from_secs(3600))
            .unwrap();
        let err = unchanged_since_listing(&file, &src).unwrap_err();
        assert!(
            err.contains(&src.local.display().to_string())
                && err.contains("changed while being read"),
            "{err}"
        );
        // Only the nanoseconds differ: still a change.
        let (_dir, src) = listed(b"same bytes");
        let file = File::open(&src.local).unwrap();
        let listed_at = std::fs::metadata(&src.local).unwrap().modified().unwrap();
        let nudged = if src.mtime_ns > 0 {
            listed_at - Duration::from_nanos(1)
        } else {
            listed_at + Duration::from_nanos(1)
        };
        File::options()
            .write(true)
            .open(&src.local)
            .unwrap()
            .set_modified(nudged)
            .unwrap();
        assert!(unchanged_since_listing(&file, &src).is_err());
    }

    #[test]
    fn a_new_size_with_the_old_mtime_is_a_change() {
        let (_dir, src) = listed(b"short");
        let file = File::open(&src.local).unwrap();
        let listed_at = std::fs::metadata(&src.local).unwrap().modified().unwrap();
        let mut writer = File::options().append(true).open(&src.local).unwrap();
        writer.write_all(b" and longer").unwrap();
        writer.set_modified(listed_at).unwrap();
        let meta = std::fs::metadata(&src.local).unwrap();
        assert_eq!(
            (meta.mtime(), meta.mtime_nsec() as u32),
            (src.mtime_s, src.mtime_ns)
        );
        let err = unchanged_since_listing(&file, &src).unwrap_err();
        assert!(err.contains("data.bin"), "{err}");
    }
}
