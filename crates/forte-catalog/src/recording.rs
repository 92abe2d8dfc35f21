//! Recording: what callers tell the catalogue, queued for the writer thread.

use std::sync::mpsc::SyncSender;

use anyhow::Result;

use crate::reads::{TunedRow, TuningSample, UsageRow};
use crate::vocabulary::{BatchKey, BatchState, FileState, PartState, Stage, Task, TaskOutcome};
use crate::writer_thread::{
    AttemptDone, BatchChange, FileChange, Msg, PartChange, Record, StageSpan, TaskRunDone,
};
use crate::Catalog;

/// Records utilisation samples into a catalogue from any thread.
#[derive(Clone)]
pub struct UsageRecorder(SyncSender<Msg>);

impl UsageRecorder {
    pub fn record(&self, row: UsageRow) {
        let _ = self.0.send(Msg::Record(Record::Usage(row)));
    }
}

/// A batch's state and totals, as its node knows them now.
#[derive(Debug, Clone)]
pub struct BatchRecord<'a> {
    /// Also says the role (edge or core) and, at the core, the site.
    pub key: &'a BatchKey,
    pub name: &'a str,
    pub files: u64,
    pub bytes: u64,
    pub state: BatchState,
    /// When the batch arrived, in microseconds since the epoch, if known (the edge: its ready
    /// marker's time): the row's `created_at` when the batch is first recorded, so its latency
    /// counts from arrival rather than from when it was found.
    pub arrived: Option<i64>,
    /// What the change was about, in the batch's lineage: a failed batch's error text.
    pub detail: Option<&'a str>,
}

/// A file's state, with whatever became known with it.
#[derive(Debug, Clone)]
pub struct FileRecord<'a> {
    pub batch: &'a BatchKey,
    pub object_id: &'a str,
    /// The object that carries it at the relay, when not its own: the bundle it travels in.
    pub carrier: Option<&'a str>,
    /// Its path in the batch.
    pub path: &'a str,
    pub size: u64,
    pub state: FileState,
    pub raw_sha256: Option<&'a str>,
    /// Its path at the destination, once delivered.
    pub delivered_to: Option<&'a str>,
    /// Why, for the lineage (a failure's message, "sealed by an earlier run").
    pub detail: Option<&'a str>,
}

impl<'a> FileRecord<'a> {
    /// A file in `state`, nothing else known with it.
    pub fn new(
        batch: &'a BatchKey,
        object_id: &'a str,
        path: &'a str,
        size: u64,
        state: FileState,
    ) -> Self {
        Self {
            batch,
            object_id,
            carrier: None,
            path,
            size,
            state,
            raw_sha256: None,
            delivered_to: None,
            detail: None,
        }
    }
}

/// One try of a task.
#[derive(Debug, Clone)]
pub struct Attempt<'a> {
    pub task: Task,
    pub batch: &'a BatchKey,
    pub object_id: Option<&'a str>,
    pub part: Option<u32>,
    pub started_at: i64,
    pub ended_at: i64,
    pub error: Option<&'a str>,
}

/// One try of a site's own task on a batch, or one of its files (`object_id`).
#[derive(Debug, Clone)]
pub struct TaskRun<'a> {
    pub batch: &'a BatchKey,
    pub task: &'a str,
    pub object_id: Option<&'a str>,
    /// 1 for the first try.
    pub try_number: u32,
    /// When it was ready to run (it waited for a slot from then to `started_at`).
    pub queued_at: i64,
    pub started_at: i64,
    pub ended_at: i64,
    pub outcome: TaskOutcome,
    /// Why it did not pass: its exit and the end of its output.
    pub detail: Option<&'a str>,
}

/// A part's hashes, recorded as they become known.
#[derive(Debug, Clone, Default)]
pub struct PartHashes<'a> {
    pub raw_sha256: Option<&'a str>,
    pub ciphertext_sha256: Option<&'a str>,
    pub ciphertext_length: Option<u64>,
    /// The raw bytes per part its object was cut into.
    pub part_size: Option<u64>,
}

impl Catalog {
    /// Records a batch's state (creating the batch on first sight) and the change as an event.
    pub fn batch_state(&self, b: &BatchRecord<'_>) -> Result<()> {
        self.submit(Record::Batch(BatchChange {
            key: b.key.clone(),
            name: b.name.into(),
            files: b.files as i64,
            bytes: b.bytes as i64,
            state: b.state,
            at: self.tick(),
            arrived: b.arrived,
            detail: b.detail.map(Into::into),
        }))
    }

    /// Records a file's state (creating it on first sight) and the change as an event.
    pub fn file_state(&self, f: &FileRecord<'_>) -> Result<()> {
        self.submit(Record::File(FileChange {
            batch: f.batch.clone(),
            object_id: f.object_id.into(),
            carrier: f.carrier.map(Into::into),
            path: f.path.into(),
            size: f.size as i64,
            state: f.state,
            raw_sha256: f.raw_sha256.map(Into::into),
            delivered_to: f.delivered_to.map(Into::into),
            detail: f.detail.map(Into::into),
            at: self.tick(),
        }))
    }

    /// Records a part's state and whatever hashes are known, and the change as an event.
    pub fn part_state(
        &self,
        batch: &BatchKey,
        object_id: &str,
        index: u32,
        state: PartState,
        hashes: &PartHashes<'_>,
    ) -> Result<()> {
        self.submit(Record::Part(PartChange {
            batch: batch.clone(),
            object_id: object_id.into(),
            index: i64::from(index),
            state,
            raw_sha256: hashes.raw_sha256.map(Into::into),
            ciphertext_sha256: hashes.ciphertext_sha256.map(Into::into),
            ciphertext_length: hashes.ciphertext_length.map(|l| l as i64),
            part_size: hashes.part_size.map(|l| l as i64),
            at: self.tick(),
        }))
    }

    /// Records one attempt of a task, successful (`error` is `None`) or not.
    pub fn attempt(&self, a: &Attempt<'_>) -> Result<()> {
        self.submit(Record::Attempt(AttemptDone {
            task: a.task,
            batch: a.batch.clone(),
            object_id: a.object_id.map(Into::into),
            part: a.part.map(i64::from),
            started_at: a.started_at,
            ended_at: a.ended_at,
            error: a.error.map(Into::into),
        }))
    }

    /// Records one try of a site's own task.
    pub fn task_run(&self, t: &TaskRun<'_>) -> Result<()> {
        self.submit(Record::TaskRun(TaskRunDone {
            batch: t.batch.clone(),
            task: t.task.into(),
            object_id: t.object_id.map(Into::into),
            try_number: i64::from(t.try_number),
            queued_at: t.queued_at,
            started_at: t.started_at,
            ended_at: t.ended_at,
            outcome: t.outcome,
            detail: t.detail.map(Into::into),
        }))
    }

    /// Records when a stage of a batch started, or (with `ended`) when it ended. Across runs a
    /// stage spans from its earliest start to its latest end: a later run's start neither
    /// moves the start nor reopens a stage that ended, and its end extends the stage. So a
    /// caller records a stage only for a run that did the stage's work (a re-run that finds
    /// everything done records none), and a run killed before its end leaves the stage as the
    /// run before it ended it, or open.
    pub fn stage(
        &self,
        batch: &BatchKey,
        stage: Stage,
        started_at: i64,
        ended_at: Option<i64>,
    ) -> Result<()> {
        self.submit(Record::Stage(StageSpan {
            batch: batch.clone(),
            stage,
            started_at,
            ended_at,
        }))
    }

    /// Keeps the setting that worked for a relay, cluster and hour (replacing the last one).
    pub fn record_tuned(&self, row: TunedRow) -> Result<()> {
        self.submit(Record::Tuned(row))
    }

    /// Records one interval of a send's tuning.
    pub fn record_tuning_sample(&self, row: TuningSample) -> Result<()> {
        self.submit(Record::TuningSample(row))
    }

    /// Records one utilisation sample.
    pub fn usage(&self, row: UsageRow) -> Result<()> {
        self.submit(Record::Usage(row))
    }

    /// A handle another thread (a sampler) can record utilisation through. Drop it before the
    /// catalogue: the catalogue waits for every such handle when it closes.
    pub fn usage_recorder(&self) -> Option<UsageRecorder> {
        self.writer
            .as_ref()
            .map(|(queue, _)| UsageRecorder(queue.clone()))
    }
}
