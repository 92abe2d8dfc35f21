//! Reading: rows as the catalogue knows them, each read after this process's queued writes.

use anyhow::{Context, Result};
use serde::Serialize;
use sqlx::any::{AnyArguments, AnyRow};
use sqlx::Row;

use crate::vocabulary::{BatchKey, BatchState, FileState, PartState, Role, Stage, Task};
use crate::Catalog;

/// A batch as the catalogue knows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BatchRow {
    pub batch_key: BatchKey,
    pub role: Role,
    pub site: String,
    pub name: String,
    pub state: BatchState,
    pub files: i64,
    pub bytes: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A file as the catalogue knows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FileRow {
    pub object_id: String,
    pub batch_key: BatchKey,
    pub path: String,
    pub size: i64,
    pub raw_sha256: Option<String>,
    pub delivered_to: Option<String>,
    pub state: FileState,
    pub updated_at: i64,
    /// The object that carries it at the relay, when not its own: the bundle it travels in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carrier: Option<String>,
}

impl FileRow {
    /// The object the relay holds this file in: its bundle's, or its own.
    pub fn at_relay(&self) -> &str {
        self.carrier.as_deref().unwrap_or(&self.object_id)
    }
}

/// One state change: of a batch, a file or a part, so its state is the text of any of the
/// three vocabularies.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Event {
    pub at: i64,
    pub batch_key: BatchKey,
    pub object_id: Option<String>,
    pub part: Option<i64>,
    pub state: String,
    pub detail: Option<String>,
}

/// Resource utilisation of one node over one interval ending at `at`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UsageRow {
    pub node: String,
    pub at: i64,
    pub seconds: f64,
    pub cpu_percent: f64,
    pub memory_used: i64,
    /// The sampling forte process's own share of the machine's CPU, 0–100, and its resident
    /// memory in bytes: what forte itself took of `cpu_percent` and `memory_used`.
    pub own_cpu_percent: f64,
    pub own_memory: i64,
    pub disk_read_bps: f64,
    pub disk_write_bps: f64,
    pub net_rx_bps: f64,
    pub net_tx_bps: f64,
}

/// The setting that worked best for a relay, a size cluster and an hour of the day.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TunedRow {
    pub relay: String,
    /// `small` or `large`: what a mean request of the run was.
    pub cluster: String,
    /// Hour of the day, 0 to 23, local time.
    pub hour: i64,
    pub uploads: i64,
    /// Bytes per second at that setting.
    pub goodput: f64,
    pub at: i64,
}

/// One interval of a send's tuning: its setting, the goodput measured, and why the setting
/// changed after it (none: it stayed).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TuningSample {
    pub node: String,
    pub at: i64,
    pub uploads: i64,
    pub level: i64,
    pub goodput: f64,
    pub reason: Option<String>,
}

/// One stage of a batch.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StageRow {
    pub stage: Stage,
    pub started_at: i64,
    pub ended_at: Option<i64>,
}

/// A part's state and hashes.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PartRow {
    pub index: i64,
    pub state: PartState,
    pub raw_sha256: Option<String>,
    pub ciphertext_sha256: Option<String>,
}

/// A failed attempt, for `forte status`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FailedAttempt {
    pub task: Task,
    pub batch_key: BatchKey,
    pub object_id: Option<String>,
    pub part: Option<i64>,
    pub error: String,
}

type Query<'q> = sqlx::query::Query<'q, sqlx::Any, AnyArguments<'q>>;

/// Column `i` of `row`, read back into its vocabulary.
fn vocabulary<T>(row: &AnyRow, i: usize, parse: fn(&str) -> Option<T>) -> Result<T> {
    let text: String = row.try_get(i)?;
    parse(&text).with_context(|| {
        format!("the catalogue holds {text:?}, which this version of forte does not know (written by a newer one?)")
    })
}

fn batch_key(row: &AnyRow, i: usize) -> Result<BatchKey> {
    Ok(BatchKey::parse(&row.try_get::<String, _>(i)?))
}

const BATCH_COLUMNS: &str =
    "SELECT batch_key, role, site, name, state, files, bytes, created_at, updated_at FROM batches";

fn batch_row(r: &AnyRow) -> Result<BatchRow> {
    Ok(BatchRow {
        batch_key: batch_key(r, 0)?,
        role: vocabulary(r, 1, Role::parse)?,
        site: r.try_get(2)?,
        name: r.try_get(3)?,
        state: vocabulary(r, 4, BatchState::parse)?,
        files: r.try_get(5)?,
        bytes: r.try_get(6)?,
        created_at: r.try_get(7)?,
        updated_at: r.try_get(8)?,
    })
}

const FILE_COLUMNS: &str = "SELECT object_id, batch_key, path, size, raw_sha256, delivered_to, state, updated_at, carrier FROM files";

fn file_row(r: &AnyRow) -> Result<FileRow> {
    Ok(FileRow {
        object_id: r.try_get(0)?,
        batch_key: batch_key(r, 1)?,
        path: r.try_get(2)?,
        size: r.try_get(3)?,
        raw_sha256: r.try_get(4)?,
        delivered_to: r.try_get(5)?,
        state: vocabulary(r, 6, FileState::parse)?,
        updated_at: r.try_get(7)?,
        carrier: r.try_get(8)?,
    })
}

impl Catalog {
    /// Runs a read after every queued write is committed, and maps each row.
    fn read<T>(&self, query: Query<'_>, map: fn(&AnyRow) -> Result<T>) -> Result<Vec<T>> {
        self.flush()?;
        let rows = self.runtime.block_on(query.fetch_all(&self.pool))?;
        rows.iter().map(map).collect()
    }

    pub fn batches(&self) -> Result<Vec<BatchRow>> {
        let sql = format!("{BATCH_COLUMNS} ORDER BY created_at, batch_key");
        self.read(sqlx::query(&sql), batch_row)
    }

    /// One batch, if the catalogue has seen it.
    pub fn batch(&self, key: &BatchKey) -> Result<Option<BatchRow>> {
        let sql = format!("{BATCH_COLUMNS} WHERE batch_key = $1");
        let rows = self.read(sqlx::query(&sql).bind(key.to_string()), batch_row)?;
        Ok(rows.into_iter().next())
    }

    /// When each stage of a batch started and ended (`None` while it runs).
    pub fn stages(&self, key: &BatchKey) -> Result<Vec<StageRow>> {
        let query = sqlx::query("SELECT stage, started_at, ended_at FROM stages WHERE batch_key = $1 ORDER BY started_at")
            .bind(key.to_string());
        self.read(query, |r| {
            Ok(StageRow {
                stage: vocabulary(r, 0, Stage::parse)?,
                started_at: r.try_get(1)?,
                ended_at: r.try_get(2)?,
            })
        })
    }

    pub fn files(&self, key: &BatchKey) -> Result<Vec<FileRow>> {
        let sql = format!("{FILE_COLUMNS} WHERE batch_key = $1 ORDER BY path");
        self.read(sqlx::query(&sql).bind(key.to_string()), file_row)
    }

    /// Files whose path (in the batch) or delivered path is `path`.
    pub fn files_at(&self, path: &str) -> Result<Vec<FileRow>> {
        let sql =
            format!("{FILE_COLUMNS} WHERE path = $1 OR delivered_to = $1 ORDER BY updated_at");
        self.read(sqlx::query(&sql).bind(path), file_row)
    }

    /// Every recorded change of a file and its parts, oldest first: its lineage.
    pub fn lineage(&self, object_id: &str) -> Result<Vec<Event>> {
        let query = sqlx::query("SELECT at, batch_key, object_id, part, state, detail FROM events WHERE object_id = $1 ORDER BY at, id")
            .bind(object_id);
        self.read(query, |r| {
            Ok(Event {
                at: r.try_get(0)?,
                batch_key: batch_key(r, 1)?,
                object_id: r.try_get(2)?,
                part: r.try_get(3)?,
                state: r.try_get(4)?,
                detail: r.try_get(5)?,
            })
        })
    }

    /// Parts of an object with their state and hashes.
    pub fn parts(&self, object_id: &str) -> Result<Vec<PartRow>> {
        let query = sqlx::query("SELECT idx, state, raw_sha256, ciphertext_sha256 FROM parts WHERE object_id = $1 ORDER BY idx")
            .bind(object_id);
        self.read(query, |r| {
            Ok(PartRow {
                index: r.try_get(0)?,
                state: vocabulary(r, 1, PartState::parse)?,
                raw_sha256: r.try_get(2)?,
                ciphertext_sha256: r.try_get(3)?,
            })
        })
    }

    /// Failed attempts, newest first (for `forte status`).
    pub fn failed_attempts(&self, limit: i64) -> Result<Vec<FailedAttempt>> {
        let query = sqlx::query("SELECT task, batch_key, object_id, part, error FROM attempts WHERE outcome = 'failed' ORDER BY ended_at DESC LIMIT $1")
            .bind(limit);
        self.read(query, |r| {
            Ok(FailedAttempt {
                task: vocabulary(r, 0, Task::parse)?,
                batch_key: batch_key(r, 1)?,
                object_id: r.try_get(2)?,
                part: r.try_get(3)?,
                error: r.try_get::<Option<String>, _>(4)?.unwrap_or_default(),
            })
        })
    }

    /// What worked for `relay`, for every cluster and hour it was measured.
    pub fn tuned(&self, relay: &str) -> Result<Vec<TunedRow>> {
        let query = sqlx::query("SELECT relay, cluster, hour, uploads, goodput, at FROM tuning WHERE relay = $1 ORDER BY cluster, hour")
            .bind(relay);
        self.read(query, |r| {
            Ok(TunedRow {
                relay: r.try_get(0)?,
                cluster: r.try_get(1)?,
                hour: r.try_get(2)?,
                uploads: r.try_get(3)?,
                goodput: r.try_get(4)?,
                at: r.try_get(5)?,
            })
        })
    }

    /// The tuning timeline of every send, oldest first.
    pub fn tuning_samples(&self) -> Result<Vec<TuningSample>> {
        let query = sqlx::query("SELECT node, at, uploads, level, goodput, reason FROM tuning_samples ORDER BY node, at");
        self.read(query, |r| {
            Ok(TuningSample {
                node: r.try_get(0)?,
                at: r.try_get(1)?,
                uploads: r.try_get(2)?,
                level: r.try_get(3)?,
                goodput: r.try_get(4)?,
                reason: r.try_get(5)?,
            })
        })
    }

    /// Utilisation samples of one node (or of every node), oldest first.
    pub fn usage_of(&self, node: Option<&str>) -> Result<Vec<UsageRow>> {
        const COLUMNS: &str = "SELECT node, at, seconds, cpu_percent, memory_used, disk_read_bps, disk_write_bps, net_rx_bps, net_tx_bps, own_cpu_percent, own_memory FROM usage";
        let (by_node, all) = (
            format!("{COLUMNS} WHERE node = $1 ORDER BY at"),
            format!("{COLUMNS} ORDER BY node, at"),
        );
        let query = match node {
            Some(node) => sqlx::query(&by_node).bind(node),
            None => sqlx::query(&all),
        };
        self.read(query, |r| {
            Ok(UsageRow {
                node: r.try_get(0)?,
                at: r.try_get(1)?,
                seconds: r.try_get(2)?,
                cpu_percent: r.try_get(3)?,
                memory_used: r.try_get(4)?,
                disk_read_bps: r.try_get(5)?,
                disk_write_bps: r.try_get(6)?,
                net_rx_bps: r.try_get(7)?,
                net_tx_bps: r.try_get(8)?,
                own_cpu_percent: r.try_get(9)?,
                own_memory: r.try_get(10)?,
            })
        })
    }
}
