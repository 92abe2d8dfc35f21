//! The catalogue: forte's governance record on every node.
//!
//! It records batches, files and parts with their hashes and current state, every state
//! change with its time (the *events* that make a file's lineage), every attempt of a task
//! with its outcome and error, and when each stage of a batch started and ended.
//!
//! A file is keyed by its batch (the edge's and the core's batch keys differ) and its object
//! id, which both ends share: in a catalogue shared by edge and core, a file's events from
//! discovery at the edge to acknowledgement at the core form one lineage.
//!
//! One code path serves both back ends through sqlx's `Any` driver: a SQLite file by default
//! (no setup; WAL mode), or PostgreSQL when the URL says `postgres://` (a catalogue shared by
//! several nodes). The SQL is the subset both speak: `$n` placeholders, `BIGINT` and `TEXT`,
//! `INSERT … ON CONFLICT … DO UPDATE`. The migrations below are the one schema for both.
//!
//! The pipelines run on plain threads, so the API is blocking. Writes are queued to a writer
//! thread that commits whatever has accumulated in one transaction (a thousand small files cost
//! a few commits, and the data path does not wait for the database); reads first wait for the
//! queue to drain, so a process sees its own writes. A process killed with SIGKILL loses the
//! records still queued (at most one commit's worth), never data.
//!
//! When the database is unavailable (a PostgreSQL server restarting, a SQLite file locked by
//! another process) the writer keeps its records and retries with backoff. The queue is
//! bounded: an outage long enough to fill it makes the daemons wait for the database rather
//! than lose their history or grow without limit.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::Serialize;
use sqlx::any::{AnyPoolOptions, AnyRow};
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::sync::Arc;

use sqlx::{AnyConnection, AnyPool, Executor, Row};

/// The schema, one migration per entry, applied in order and recorded in `forte_migrations`.
const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    "CREATE TABLE batches (
        batch_key TEXT PRIMARY KEY,
        role TEXT NOT NULL,
        site TEXT NOT NULL,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        files BIGINT NOT NULL,
        bytes BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL
    );
    CREATE TABLE files (
        object_id TEXT NOT NULL,
        batch_key TEXT NOT NULL,
        path TEXT NOT NULL,
        size BIGINT NOT NULL,
        raw_sha256 TEXT,
        delivered_to TEXT,
        state TEXT NOT NULL,
        updated_at BIGINT NOT NULL,
        PRIMARY KEY (batch_key, object_id)
    );
    CREATE INDEX files_by_object ON files (object_id);
    CREATE INDEX files_by_path ON files (path);
    CREATE TABLE parts (
        object_id TEXT NOT NULL,
        idx BIGINT NOT NULL,
        raw_sha256 TEXT,
        ciphertext_sha256 TEXT,
        ciphertext_length BIGINT,
        state TEXT NOT NULL,
        updated_at BIGINT NOT NULL,
        PRIMARY KEY (object_id, idx)
    );
    CREATE TABLE events (
        id TEXT PRIMARY KEY,
        at BIGINT NOT NULL,
        batch_key TEXT NOT NULL,
        object_id TEXT,
        part BIGINT,
        state TEXT NOT NULL,
        detail TEXT
    );
    CREATE INDEX events_by_object ON events (object_id, at);
    CREATE TABLE attempts (
        id TEXT PRIMARY KEY,
        task TEXT NOT NULL,
        batch_key TEXT NOT NULL,
        object_id TEXT,
        part BIGINT,
        started_at BIGINT NOT NULL,
        ended_at BIGINT NOT NULL,
        outcome TEXT NOT NULL,
        error TEXT
    );
    CREATE TABLE stages (
        batch_key TEXT NOT NULL,
        stage TEXT NOT NULL,
        started_at BIGINT NOT NULL,
        ended_at BIGINT,
        PRIMARY KEY (batch_key, stage)
    )",
    // 2: resource utilisation, sampled once a second on each node.
    "CREATE TABLE usage (
        node TEXT NOT NULL,
        at BIGINT NOT NULL,
        seconds DOUBLE PRECISION NOT NULL,
        cpu_percent DOUBLE PRECISION NOT NULL,
        memory_used BIGINT NOT NULL,
        disk_read_bps DOUBLE PRECISION NOT NULL,
        disk_write_bps DOUBLE PRECISION NOT NULL,
        net_rx_bps DOUBLE PRECISION NOT NULL,
        net_tx_bps DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (node, at)
    )",
];

/// Microseconds since the Unix epoch: the catalogue's clock.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

fn new_id() -> String {
    let mut b = [0u8; 12];
    getrandom::getrandom(&mut b).expect("the operating system's random source");
    hex::encode(b)
}

/// The states a file goes through, in order. The catalogue records a file's state only
/// forwards: a state ranked below the file's current one (a later run discovering again a file
/// that an earlier run sent, or the core acknowledged) leaves the row and its lineage as they
/// are. `failed` and `damaged` are set-backs, not steps: recorded while the file is not yet
/// delivered (any state may then follow them, a retry starting over), and never after.
/// States this list does not know are recorded as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FileState {
    Discovered,
    /// At the relay: uploaded, or found there by a later run.
    AtRelay,
    Sealed,
    Verified,
    Delivered,
    Acknowledged,
}

impl FileState {
    /// The step a state names; `None` for a set-back or a state not in the order.
    pub fn parse(state: &str) -> Option<Self> {
        Some(match state {
            "discovered" => Self::Discovered,
            "at_relay" | "uploaded" => Self::AtRelay,
            "sealed" => Self::Sealed,
            "verified" => Self::Verified,
            "delivered" => Self::Delivered,
            "acknowledged" => Self::Acknowledged,
            _ => return None,
        })
    }

    /// Whether a file in state `was` may be recorded as `next`.
    pub fn may_follow(was: &str, next: &str) -> bool {
        let setback = |s: &str| matches!(s, "failed" | "damaged");
        match (Self::parse(was), Self::parse(next)) {
            (Some(was), Some(next)) => next >= was,
            (Some(was), None) if setback(next) => was < Self::Delivered,
            _ => true,
        }
    }
}

/// The states a batch goes through on its node, in order: at the edge queued, sending, sent,
/// source_deleted; at the core pulling, delivered. Recorded only forwards (the same state
/// again refreshes the batch's totals, nothing else). `failed`, `cancelled` and `source_kept`
/// are set-backs that a retry's states may follow (a failed send is sent again, a cancelled
/// batch whose ready marker is touched is queued again, a file that appears in a batch whose
/// sendable files were all deleted is sent as a follow-up); they are not recorded over a batch
/// that is finished for good (delivered at the core, its source deleted at the edge).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum BatchState {
    /// queued (edge), pulling (core)
    Queued,
    Sending,
    Sent,
    Delivered,
    SourceDeleted,
}

impl BatchState {
    /// The step a state names; `None` for a set-back or a state not in the order.
    pub fn parse(state: &str) -> Option<Self> {
        Some(match state {
            "queued" | "pulling" => Self::Queued,
            "sending" => Self::Sending,
            "sent" => Self::Sent,
            "delivered" | "acknowledged" => Self::Delivered,
            "source_deleted" => Self::SourceDeleted,
            _ => return None,
        })
    }

    /// Whether a batch in state `was` may be recorded as `next`.
    pub fn may_follow(was: &str, next: &str) -> bool {
        let setback = |s: &str| matches!(s, "failed" | "cancelled" | "source_kept");
        match (Self::parse(was), Self::parse(next)) {
            (Some(was), Some(next)) => next >= was,
            (Some(was), None) if setback(next) => {
                !matches!(was, Self::Delivered | Self::SourceDeleted)
            }
            _ => true,
        }
    }
}

/// A batch as the catalogue knows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BatchRow {
    pub batch_key: String,
    pub role: String,
    pub site: String,
    pub name: String,
    pub state: String,
    pub files: i64,
    pub bytes: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A file as the catalogue knows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FileRow {
    pub object_id: String,
    pub batch_key: String,
    pub path: String,
    pub size: i64,
    pub raw_sha256: Option<String>,
    pub delivered_to: Option<String>,
    pub state: String,
    pub updated_at: i64,
}

/// One state change.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Event {
    pub at: i64,
    pub batch_key: String,
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
    pub disk_read_bps: f64,
    pub disk_write_bps: f64,
    pub net_rx_bps: f64,
    pub net_tx_bps: f64,
}

/// Records utilisation samples into a catalogue from any thread.
#[derive(Clone)]
pub struct UsageRecorder(SyncSender<Msg>);

impl UsageRecorder {
    pub fn record(&self, row: UsageRow) {
        let _ = self.0.send(Msg::Record(Record::Usage(row)));
    }
}

/// One stage of a batch.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StageRow {
    pub stage: String,
    pub started_at: i64,
    pub ended_at: Option<i64>,
}

/// A part's state and hashes.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PartRow {
    pub index: i64,
    pub state: String,
    pub raw_sha256: Option<String>,
    pub ciphertext_sha256: Option<String>,
}

/// A failed attempt, for `forte status`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FailedAttempt {
    pub task: String,
    pub batch_key: String,
    pub object_id: Option<String>,
    pub part: Option<i64>,
    pub error: String,
}

/// One try of a task.
#[derive(Debug, Clone)]
pub struct Attempt<'a> {
    pub task: &'a str,
    pub batch_key: &'a str,
    pub object_id: Option<&'a str>,
    pub part: Option<u32>,
    pub started_at: i64,
    pub ended_at: i64,
    pub error: Option<&'a str>,
}

/// A part's hashes, recorded as they become known.
#[derive(Debug, Clone, Default)]
pub struct PartHashes<'a> {
    pub raw_sha256: Option<&'a str>,
    pub ciphertext_sha256: Option<&'a str>,
    pub ciphertext_length: Option<u64>,
}

pub struct Catalog {
    runtime: Arc<tokio::runtime::Runtime>,
    pool: AnyPool,
    url: String,
    /// Records go to a writer thread that commits whatever has queued up in one transaction,
    /// so the data path never waits for the database, and a thousand small files cost a few
    /// commits, not thousands.
    writer: Option<(SyncSender<Msg>, std::thread::JoinHandle<()>)>,
    /// The last event time handed out: events of one process get strictly increasing times,
    /// so a lineage keeps its order even when changes come within the same microsecond.
    last_at: std::sync::atomic::AtomicI64,
}

/// One change to record, with the time it happened.
enum Record {
    Batch {
        batch_key: String,
        role: String,
        site: String,
        name: String,
        files: i64,
        bytes: i64,
        state: String,
        at: i64,
    },
    File {
        batch_key: String,
        object_id: String,
        path: String,
        size: i64,
        state: String,
        raw_sha256: Option<String>,
        delivered_to: Option<String>,
        detail: Option<String>,
        at: i64,
    },
    Part {
        batch_key: String,
        object_id: String,
        index: i64,
        state: String,
        raw_sha256: Option<String>,
        ciphertext_sha256: Option<String>,
        ciphertext_length: Option<i64>,
        at: i64,
    },
    Attempt {
        task: String,
        batch_key: String,
        object_id: Option<String>,
        part: Option<i64>,
        started_at: i64,
        ended_at: i64,
        error: Option<String>,
    },
    Stage {
        batch_key: String,
        stage: String,
        started_at: i64,
        ended_at: Option<i64>,
    },
    Usage(UsageRow),
}

enum Msg {
    Record(Record),
    /// Answered once everything sent before it is committed.
    Flush(Sender<()>),
}

async fn event(
    conn: &mut AnyConnection,
    at: i64,
    batch_key: &str,
    object_id: Option<&str>,
    part: Option<i64>,
    state: &str,
    detail: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO events (id, at, batch_key, object_id, part, state, detail) VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(new_id())
        .bind(at)
        .bind(batch_key)
        .bind(object_id)
        .bind(part)
        .bind(state)
        .bind(detail)
        .execute(conn)
        .await
        .map(drop)
}

/// Writes one record (and its event) on `conn`.
async fn apply(conn: &mut AnyConnection, record: &Record) -> sqlx::Result<()> {
    match record {
        Record::Batch { batch_key, role, site, name, files, bytes, state, at } => {
            let current = sqlx::query("SELECT state, files, bytes, updated_at FROM batches WHERE batch_key = $1")
                .bind(batch_key)
                .fetch_optional(&mut *conn)
                .await?;
            // The totals come from the batch's files: one per path (a file changed in place
            // gets a new object id under the same path), at its largest recorded size. The
            // core's bytes are what went over the wire, which its file rows do not say: there
            // only the callers' figures count. Either way a total is never lowered, so a run
            // that saw part of a batch cannot shrink it.
            let from_files = sqlx::query(
                "SELECT COUNT(*), CAST(COALESCE(SUM(s), 0) AS BIGINT)
                 FROM (SELECT path, MAX(size) AS s FROM files WHERE batch_key = $1 GROUP BY path) t",
            )
            .bind(batch_key)
            .fetch_one(&mut *conn)
            .await?;
            let (rows_files, rows_bytes): (i64, i64) = (from_files.try_get(0)?, from_files.try_get(1)?);
            let rows_bytes = if role == "edge" { rows_bytes } else { 0 };
            let Some(current) = current else {
                sqlx::query(
                    "INSERT INTO batches (batch_key, role, site, name, state, files, bytes, created_at, updated_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
                )
                .bind(batch_key)
                .bind(role)
                .bind(site)
                .bind(name)
                .bind(state)
                .bind((*files).max(rows_files))
                .bind((*bytes).max(rows_bytes))
                .bind(at)
                .execute(&mut *conn)
                .await?;
                return event(conn, *at, batch_key, None, None, state, None).await;
            };
            let (was, was_files, was_bytes, was_at): (String, i64, i64, i64) = (
                current.try_get(0)?,
                current.try_get(1)?,
                current.try_get(2)?,
                current.try_get(3)?,
            );
            let files = (*files).max(rows_files).max(was_files);
            let bytes = (*bytes).max(rows_bytes).max(was_bytes);
            let (state, moved) = if BatchState::may_follow(&was, state) {
                (state.as_str(), was != *state)
            } else {
                (was.as_str(), false)
            };
            sqlx::query(
                "UPDATE batches SET state = $2, files = $3, bytes = $4, name = $5, updated_at = $6
                 WHERE batch_key = $1",
            )
            .bind(batch_key)
            .bind(state)
            .bind(files)
            .bind(bytes)
            .bind(name)
            .bind(if moved { *at } else { was_at })
            .execute(&mut *conn)
            .await?;
            if moved {
                event(conn, *at, batch_key, None, None, state, None).await?;
            }
            Ok(())
        }
        Record::File { batch_key, object_id, path, size, state, raw_sha256, delivered_to, detail, at } => {
            let current: Option<String> =
                sqlx::query("SELECT state FROM files WHERE batch_key = $1 AND object_id = $2")
                    .bind(batch_key)
                    .bind(object_id)
                    .fetch_optional(&mut *conn)
                    .await?
                    .map(|r| r.try_get(0))
                    .transpose()?;
            // A state that would move the file backwards (a re-run discovering a file the
            // core already acknowledged, a failed attempt after a delivery) is not recorded,
            // neither on the row nor in its lineage.
            if let Some(was) = &current {
                if !FileState::may_follow(was, state) {
                    return Ok(());
                }
            }
            sqlx::query(
                "INSERT INTO files (object_id, batch_key, path, size, raw_sha256, delivered_to, state, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (batch_key, object_id) DO UPDATE SET state = excluded.state,
                     raw_sha256 = COALESCE(excluded.raw_sha256, files.raw_sha256),
                     delivered_to = COALESCE(excluded.delivered_to, files.delivered_to),
                     updated_at = excluded.updated_at",
            )
            .bind(object_id)
            .bind(batch_key)
            .bind(path)
            .bind(size)
            .bind(raw_sha256.as_deref())
            .bind(delivered_to.as_deref())
            .bind(state)
            .bind(at)
            .execute(&mut *conn)
            .await?;
            // The same state again is an event only when it says something (a detail).
            if current.as_deref() == Some(state.as_str()) && detail.is_none() {
                return Ok(());
            }
            event(conn, *at, batch_key, Some(object_id), None, state, detail.as_deref()).await
        }
        Record::Part { batch_key, object_id, index, state, raw_sha256, ciphertext_sha256, ciphertext_length, at } => {
            sqlx::query(
                "INSERT INTO parts (object_id, idx, raw_sha256, ciphertext_sha256, ciphertext_length, state, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (object_id, idx) DO UPDATE SET state = excluded.state,
                     raw_sha256 = COALESCE(excluded.raw_sha256, parts.raw_sha256),
                     ciphertext_sha256 = COALESCE(excluded.ciphertext_sha256, parts.ciphertext_sha256),
                     ciphertext_length = COALESCE(excluded.ciphertext_length, parts.ciphertext_length),
                     updated_at = excluded.updated_at",
            )
            .bind(object_id)
            .bind(index)
            .bind(raw_sha256.as_deref())
            .bind(ciphertext_sha256.as_deref())
            .bind(ciphertext_length)
            .bind(state)
            .bind(at)
            .execute(&mut *conn)
            .await?;
            event(conn, *at, batch_key, Some(object_id), Some(*index), state, None).await
        }
        Record::Attempt { task, batch_key, object_id, part, started_at, ended_at, error } => sqlx::query(
            "INSERT INTO attempts (id, task, batch_key, object_id, part, started_at, ended_at, outcome, error)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(new_id())
        .bind(task)
        .bind(batch_key)
        .bind(object_id.as_deref())
        .bind(part)
        .bind(started_at)
        .bind(ended_at)
        .bind(if error.is_some() { "failed" } else { "ok" })
        .bind(error.as_deref())
        .execute(conn)
        .await
        .map(drop),
        Record::Usage(u) => sqlx::query(
            "INSERT INTO usage (node, at, seconds, cpu_percent, memory_used, disk_read_bps, disk_write_bps, net_rx_bps, net_tx_bps)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (node, at) DO NOTHING",
        )
        .bind(&u.node)
        .bind(u.at)
        .bind(u.seconds)
        .bind(u.cpu_percent)
        .bind(u.memory_used)
        .bind(u.disk_read_bps)
        .bind(u.disk_write_bps)
        .bind(u.net_rx_bps)
        .bind(u.net_tx_bps)
        .execute(conn)
        .await
        .map(drop),
        Record::Stage { batch_key, stage, started_at, ended_at } => sqlx::query(
            "INSERT INTO stages (batch_key, stage, started_at, ended_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (batch_key, stage) DO UPDATE SET
                 started_at = CASE WHEN excluded.started_at < stages.started_at
                     THEN excluded.started_at ELSE stages.started_at END,
                 ended_at = CASE
                     WHEN excluded.ended_at IS NULL THEN stages.ended_at
                     WHEN stages.ended_at IS NULL OR excluded.ended_at > stages.ended_at
                         THEN excluded.ended_at
                     ELSE stages.ended_at END",
        )
        .bind(batch_key)
        .bind(stage)
        .bind(started_at)
        .bind(ended_at)
        .execute(conn)
        .await
        .map(drop),
    }
}

/// Brings the schema up to date on `conn`, inside the caller's transaction.
async fn apply_migrations(conn: &mut AnyConnection) -> std::result::Result<(), sqlx::Error> {
    conn.execute("CREATE TABLE IF NOT EXISTS forte_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)")
        .await?;
    let applied: i64 = sqlx::query("SELECT COUNT(*) FROM forte_migrations")
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
    for (i, migration) in MIGRATIONS.iter().enumerate().skip(applied as usize) {
        for statement in migration.split(';').filter(|s| !s.trim().is_empty()) {
            conn.execute(statement).await?;
        }
        sqlx::query("INSERT INTO forte_migrations (version, applied_at) VALUES ($1, $2)")
            .bind(i as i64 + 1)
            .bind(now_us())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Whether `e` means the database cannot be reached or is busy right now (a server restarting,
/// a dropped connection, a SQLite file locked by another process for longer than the busy
/// timeout), as opposed to a record it refuses. Records are kept and retried through the first
/// kind; the second costs only the record.
fn unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // PostgreSQL: connection exceptions (08…), shutting down or starting up (57P0…),
            // too many connections, serialization failure or deadlock. SQLite: BUSY and
            // LOCKED with their extended codes (primary code in the low byte).
            code.starts_with("08")
                || code.starts_with("57P0")
                || matches!(code.as_ref(), "53300" | "40001" | "40P01")
                || code.parse::<i32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
        }),
        _ => false,
    }
}

/// Commits `records` in one transaction; if the database refuses that, record by record, so
/// one bad record costs only itself (reported on stderr: the transfer goes on). Fails only when
/// the database is unavailable, with how many leading records are already committed.
async fn commit(
    pool: &AnyPool,
    records: &[Record],
) -> std::result::Result<(), (usize, sqlx::Error)> {
    let together = async {
        let mut tx = pool.begin().await?;
        for r in records {
            apply(&mut tx, r).await?;
        }
        tx.commit().await
    };
    match together.await {
        Ok(()) => return Ok(()),
        Err(e) if unavailable(&e) => return Err((0, e)),
        Err(_) => {}
    }
    for (done, r) in records.iter().enumerate() {
        let result = async { apply(&mut *pool.acquire().await?, r).await }.await;
        match result {
            Ok(()) => {}
            Err(e) if unavailable(&e) => return Err((done, e)),
            Err(e) => eprintln!("warning: catalogue: a record was not written: {e}"),
        }
    }
    Ok(())
}

/// Records queued for the writer before `submit` blocks. While the database is unavailable the
/// writer holds what it has and stops taking more, so a long outage makes the daemons wait here
/// with bounded memory instead of dropping their history.
const QUEUE_CAPACITY: usize = 20_000;

/// Most records in one transaction.
const RECORDS_PER_COMMIT: usize = 5_000;

fn writer(runtime: Arc<tokio::runtime::Runtime>, pool: AnyPool, url: String, inbox: Receiver<Msg>) {
    let (mut records, mut flushes) = (Vec::new(), Vec::new());
    let mut outage: Option<(std::time::Instant, std::time::Duration)> = None;
    loop {
        // Everything that queued up while the last commit ran goes into this one; block for
        // the first message only when nothing is waiting to be committed.
        while records.len() < RECORDS_PER_COMMIT {
            let next = if records.is_empty() && flushes.is_empty() {
                inbox.recv().ok()
            } else {
                inbox.try_recv().ok()
            };
            match next {
                Some(Msg::Record(r)) => records.push(r),
                Some(Msg::Flush(done)) => flushes.push(done),
                None => break,
            }
        }
        if records.is_empty() && flushes.is_empty() {
            return; // every sender is gone
        }
        if !records.is_empty() {
            if let Err((done, e)) = runtime.block_on(commit(&pool, &records)) {
                records.drain(..done);
                let (since, delay) = outage.get_or_insert((
                    std::time::Instant::now(),
                    std::time::Duration::from_millis(250),
                ));
                eprintln!(
                    "warning: catalogue {url} unavailable for {:.0} s ({e}); holding {} records, retrying in {:.1} s",
                    since.elapsed().as_secs_f64(),
                    records.len(),
                    delay.as_secs_f64()
                );
                std::thread::sleep(*delay);
                *delay = (*delay * 2).min(std::time::Duration::from_secs(10));
                continue;
            }
            if let Some((since, _)) = outage.take() {
                eprintln!(
                    "catalogue {url} available again after {:.0} s; the held records are written",
                    since.elapsed().as_secs_f64()
                );
            }
            records.clear();
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

impl Drop for Catalog {
    fn drop(&mut self) {
        if let Some((queue, thread)) = self.writer.take() {
            drop(queue);
            let _ = thread.join();
        }
    }
}

impl Catalog {
    /// Opens (creating if needed) the catalogue at `url`: `postgres://…`, `sqlite://PATH`, or a
    /// plain file path for SQLite. Applies pending migrations.
    pub fn open(url: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let url = if url.contains("://") {
            url.to_string()
        } else {
            let path = Path::new(url);
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).with_context(|| {
                    format!("cannot create the catalogue's directory {}", dir.display())
                })?;
            }
            format!("sqlite://{}?mode=rwc", path.display())
        };
        let runtime = Arc::new(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .context("starting the catalogue's runtime")?,
        );
        let shown = redact(&url);
        let pool = runtime
            .block_on(
                AnyPoolOptions::new()
                    .max_connections(4)
                    // Past this, a write is held and retried by the writer (which says so) and
                    // a read fails with the reason, instead of hanging silently.
                    .acquire_timeout(std::time::Duration::from_secs(5))
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            if conn.backend_name() == "SQLite" {
                                // WAL lets readers (forte status) work beside the writer; a
                                // busy timeout makes concurrent writers wait, not fail.
                                conn.execute("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 10000")
                                    .await?;
                            }
                            Ok(())
                        })
                    })
                    .connect(&url),
            )
            .with_context(|| format!("cannot open the catalogue {shown}"))?;
        let mut catalog = Self {
            runtime,
            pool,
            url: shown,
            writer: None,
            last_at: Default::default(),
        };
        catalog.migrate()?;
        let (queue, inbox) = std::sync::mpsc::sync_channel(QUEUE_CAPACITY);
        let (runtime, pool) = (catalog.runtime.clone(), catalog.pool.clone());
        let url = catalog.url.clone();
        let thread = std::thread::Builder::new()
            .name("forte-catalog".into())
            .spawn(move || writer(runtime, pool, url, inbox))
            .context("starting the catalogue writer")?;
        catalog.writer = Some((queue, thread));
        Ok(catalog)
    }

    /// The catalogue's URL without credentials, for messages.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn migrate(&self) -> Result<()> {
        self.runtime
            .block_on(async {
                let mut conn = self.pool.acquire().await?;
                // One migrator at a time: daemons starting together on a fresh catalogue would
                // otherwise all create the schema (PostgreSQL fails such a race with a
                // duplicate key in its own catalogue). SQLite takes the write lock at BEGIN
                // IMMEDIATE; PostgreSQL holds an advisory lock around one transaction.
                let (lock, done, undo) = if conn.backend_name() == "SQLite" {
                    ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")
                } else {
                    (
                        "SELECT pg_advisory_lock(435459733093); BEGIN",
                        "COMMIT; SELECT pg_advisory_unlock(435459733093)",
                        "ROLLBACK; SELECT pg_advisory_unlock(435459733093)",
                    )
                };
                conn.execute(lock).await?;
                match apply_migrations(&mut conn).await {
                    Ok(()) => conn.execute(done).await.map(drop),
                    Err(e) => {
                        let _ = conn.execute(undo).await;
                        Err(e)
                    }
                }
            })
            .with_context(|| format!("cannot migrate the catalogue {}", self.url))
    }

    /// Now, or just after the last time handed out.
    fn tick(&self) -> i64 {
        use std::sync::atomic::Ordering::Relaxed;
        let now = now_us();
        let mut last = self.last_at.load(Relaxed);
        loop {
            let next = now.max(last + 1);
            match self
                .last_at
                .compare_exchange_weak(last, next, Relaxed, Relaxed)
            {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }

    fn submit(&self, record: Record) -> Result<()> {
        let (queue, _) = self.writer.as_ref().context("the catalogue is closed")?;
        queue
            .send(Msg::Record(record))
            .ok()
            .context("the catalogue writer stopped")
    }

    /// Waits until every record submitted so far is committed; reads call it first, so they
    /// see this process's own writes.
    pub fn flush(&self) -> Result<()> {
        let (queue, _) = self.writer.as_ref().context("the catalogue is closed")?;
        let (done, wait) = std::sync::mpsc::channel();
        queue
            .send(Msg::Flush(done))
            .ok()
            .context("the catalogue writer stopped")?;
        wait.recv().ok().context("the catalogue writer stopped")
    }

    /// Records a batch's state (creating the batch on first sight) and the change as an event.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_state(
        &self,
        batch_key: &str,
        role: &str,
        site: &str,
        name: &str,
        files: u64,
        bytes: u64,
        state: &str,
    ) -> Result<()> {
        self.submit(Record::Batch {
            batch_key: batch_key.into(),
            role: role.into(),
            site: site.into(),
            name: name.into(),
            files: files as i64,
            bytes: bytes as i64,
            state: state.into(),
            at: self.tick(),
        })
    }

    /// Records a file's state (creating it on first sight) and the change as an event.
    #[allow(clippy::too_many_arguments)]
    pub fn file_state(
        &self,
        batch_key: &str,
        object_id: &str,
        path: &str,
        size: u64,
        state: &str,
        raw_sha256: Option<&str>,
        delivered_to: Option<&str>,
        detail: Option<&str>,
    ) -> Result<()> {
        self.submit(Record::File {
            batch_key: batch_key.into(),
            object_id: object_id.into(),
            path: path.into(),
            size: size as i64,
            state: state.into(),
            raw_sha256: raw_sha256.map(Into::into),
            delivered_to: delivered_to.map(Into::into),
            detail: detail.map(Into::into),
            at: self.tick(),
        })
    }

    /// Records a part's state and whatever hashes are known, and the change as an event.
    pub fn part_state(
        &self,
        batch_key: &str,
        object_id: &str,
        index: u32,
        state: &str,
        hashes: &PartHashes<'_>,
    ) -> Result<()> {
        self.submit(Record::Part {
            batch_key: batch_key.into(),
            object_id: object_id.into(),
            index: i64::from(index),
            state: state.into(),
            raw_sha256: hashes.raw_sha256.map(Into::into),
            ciphertext_sha256: hashes.ciphertext_sha256.map(Into::into),
            ciphertext_length: hashes.ciphertext_length.map(|l| l as i64),
            at: self.tick(),
        })
    }

    /// Records one attempt of a task, successful (`error` is `None`) or not.
    pub fn attempt(&self, a: &Attempt<'_>) -> Result<()> {
        self.submit(Record::Attempt {
            task: a.task.into(),
            batch_key: a.batch_key.into(),
            object_id: a.object_id.map(Into::into),
            part: a.part.map(i64::from),
            started_at: a.started_at,
            ended_at: a.ended_at,
            error: a.error.map(Into::into),
        })
    }

    /// Records when a stage of a batch started, or (with `ended`) when it ended. Across runs a
    /// stage spans from its earliest start to its latest end: a later run's start neither
    /// moves the start nor reopens a stage that ended, and its end extends the stage. So a
    /// caller records a stage only for a run that did the stage's work (a re-run that finds
    /// everything done records none), and a run killed before its end leaves the stage as the
    /// run before it ended it, or open.
    pub fn stage(
        &self,
        batch_key: &str,
        stage: &str,
        started_at: i64,
        ended_at: Option<i64>,
    ) -> Result<()> {
        self.submit(Record::Stage {
            batch_key: batch_key.into(),
            stage: stage.into(),
            started_at,
            ended_at,
        })
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

    /// Utilisation samples of one node (or of every node), oldest first.
    pub fn usage_of(&self, node: Option<&str>) -> Result<Vec<UsageRow>> {
        const COLUMNS: &str = "SELECT node, at, seconds, cpu_percent, memory_used, disk_read_bps, disk_write_bps, net_rx_bps, net_tx_bps FROM usage";
        let (by_node, all) = (
            format!("{COLUMNS} WHERE node = $1 ORDER BY at"),
            format!("{COLUMNS} ORDER BY node, at"),
        );
        let rows = match node {
            Some(node) => self.read(sqlx::query(&by_node).bind(node))?,
            None => self.read(sqlx::query(&all))?,
        };
        rows.iter()
            .map(|r| {
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
                })
            })
            .collect()
    }

    /// Runs a read after every queued write is committed.
    fn read<'q>(
        &self,
        query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    ) -> Result<Vec<AnyRow>> {
        self.flush()?;
        Ok(self.runtime.block_on(query.fetch_all(&self.pool))?)
    }

    pub fn batches(&self) -> Result<Vec<BatchRow>> {
        let rows = self.read(
            sqlx::query("SELECT batch_key, role, site, name, state, files, bytes, created_at, updated_at FROM batches ORDER BY created_at, batch_key"),
        )?;
        rows.iter().map(batch_row).collect()
    }

    /// When each stage of a batch started and ended (`None` while it runs).
    pub fn stages(&self, batch_key: &str) -> Result<Vec<StageRow>> {
        let rows = self.read(
            sqlx::query("SELECT stage, started_at, ended_at FROM stages WHERE batch_key = $1 ORDER BY started_at")
                .bind(batch_key),
        )?;
        rows.iter()
            .map(|r| {
                Ok(StageRow {
                    stage: r.try_get(0)?,
                    started_at: r.try_get(1)?,
                    ended_at: r.try_get(2)?,
                })
            })
            .collect()
    }

    /// One batch, if the catalogue has seen it.
    pub fn batch(&self, batch_key: &str) -> Result<Option<BatchRow>> {
        let rows = self.read(
            sqlx::query("SELECT batch_key, role, site, name, state, files, bytes, created_at, updated_at FROM batches WHERE batch_key = $1")
                .bind(batch_key),
        )?;
        rows.first().map(batch_row).transpose()
    }

    pub fn files(&self, batch_key: &str) -> Result<Vec<FileRow>> {
        let rows = self.read(
            sqlx::query("SELECT object_id, batch_key, path, size, raw_sha256, delivered_to, state, updated_at FROM files WHERE batch_key = $1 ORDER BY path")
                .bind(batch_key),
        )?;
        rows.iter().map(file_row).collect()
    }

    /// Files whose path (in the batch) or delivered path is `path`.
    pub fn files_at(&self, path: &str) -> Result<Vec<FileRow>> {
        let rows = self.read(
            sqlx::query("SELECT object_id, batch_key, path, size, raw_sha256, delivered_to, state, updated_at FROM files WHERE path = $1 OR delivered_to = $1 ORDER BY updated_at")
                .bind(path),
        )?;
        rows.iter().map(file_row).collect()
    }

    /// Every recorded change of a file and its parts, oldest first: its lineage.
    pub fn lineage(&self, object_id: &str) -> Result<Vec<Event>> {
        let rows = self.read(
            sqlx::query("SELECT at, batch_key, object_id, part, state, detail FROM events WHERE object_id = $1 ORDER BY at, id")
                .bind(object_id),
        )?;
        rows.iter()
            .map(|r| {
                Ok(Event {
                    at: r.try_get(0)?,
                    batch_key: r.try_get(1)?,
                    object_id: r.try_get(2)?,
                    part: r.try_get(3)?,
                    state: r.try_get(4)?,
                    detail: r.try_get(5)?,
                })
            })
            .collect()
    }

    /// Parts of an object with their state and hashes.
    pub fn parts(&self, object_id: &str) -> Result<Vec<PartRow>> {
        let rows = self.read(
            sqlx::query("SELECT idx, state, raw_sha256, ciphertext_sha256 FROM parts WHERE object_id = $1 ORDER BY idx")
                .bind(object_id),
        )?;
        rows.iter()
            .map(|r| {
                Ok(PartRow {
                    index: r.try_get(0)?,
                    state: r.try_get(1)?,
                    raw_sha256: r.try_get(2)?,
                    ciphertext_sha256: r.try_get(3)?,
                })
            })
            .collect()
    }

    /// Failed attempts, newest first (for `forte status`).
    pub fn failed_attempts(&self, limit: i64) -> Result<Vec<FailedAttempt>> {
        let rows = self.read(
            sqlx::query("SELECT task, batch_key, object_id, part, error FROM attempts WHERE outcome = 'failed' ORDER BY ended_at DESC LIMIT $1")
                .bind(limit),
        )?;
        rows.iter()
            .map(|r| {
                Ok(FailedAttempt {
                    task: r.try_get(0)?,
                    batch_key: r.try_get(1)?,
                    object_id: r.try_get(2)?,
                    part: r.try_get(3)?,
                    error: r.try_get::<Option<String>, _>(4)?.unwrap_or_default(),
                })
            })
            .collect()
    }
}

fn batch_row(r: &AnyRow) -> Result<BatchRow> {
    Ok(BatchRow {
        batch_key: r.try_get(0)?,
        role: r.try_get(1)?,
        site: r.try_get(2)?,
        name: r.try_get(3)?,
        state: r.try_get(4)?,
        files: r.try_get(5)?,
        bytes: r.try_get(6)?,
        created_at: r.try_get(7)?,
        updated_at: r.try_get(8)?,
    })
}

fn file_row(r: &AnyRow) -> Result<FileRow> {
    Ok(FileRow {
        object_id: r.try_get(0)?,
        batch_key: r.try_get(1)?,
        path: r.try_get(2)?,
        size: r.try_get(3)?,
        raw_sha256: r.try_get(4)?,
        delivered_to: r.try_get(5)?,
        state: r.try_get(6)?,
        updated_at: r.try_get(7)?,
    })
}

/// A URL with any password replaced, safe to print.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same checks run on SQLite here and on PostgreSQL in tests/postgres.rs.
    pub fn exercise(catalog: &Catalog) {
        catalog
            .batch_state("b1", "edge", "site-a", "run-1", 2, 300, "discovered")
            .unwrap();
        catalog
            .file_state(
                "b1",
                "o1",
                "bags/a.bag",
                200,
                "discovered",
                None,
                None,
                None,
            )
            .unwrap();
        catalog
            .part_state(
                "b1",
                "o1",
                0,
                "uploaded",
                &PartHashes {
                    raw_sha256: Some("r0"),
                    ciphertext_sha256: Some("c0"),
                    ciphertext_length: Some(90),
                },
            )
            .unwrap();
        catalog
            .file_state(
                "b1",
                "o1",
                "bags/a.bag",
                200,
                "sealed",
                Some("whole"),
                None,
                None,
            )
            .unwrap();
        catalog
            .file_state(
                "b1",
                "o1",
                "bags/a.bag",
                200,
                "delivered",
                None,
                Some("site-a/run-1/bags/a.bag"),
                Some("ok"),
            )
            .unwrap();
        catalog
            .batch_state("b1", "edge", "site-a", "run-1", 2, 300, "sent")
            .unwrap();
        catalog
            .attempt(&Attempt {
                task: "upload",
                batch_key: "b1",
                object_id: Some("o1"),
                part: Some(0),
                started_at: 1,
                ended_at: 2,
                error: Some("connection reset"),
            })
            .unwrap();
        catalog.stage("b1", "prepare", 10, None).unwrap();
        catalog.stage("b1", "prepare", 10, Some(20)).unwrap();

        let batches = catalog.batches().unwrap();
        assert_eq!(
            (batches.len(), batches[0].state.as_str(), batches[0].files),
            (1, "sent", 2)
        );
        let files = catalog.files("b1").unwrap();
        assert_eq!(files[0].state, "delivered");
        assert_eq!(files[0].raw_sha256.as_deref(), Some("whole"));
        assert_eq!(
            catalog.files_at("site-a/run-1/bags/a.bag").unwrap().len(),
            1
        );
        let lineage: Vec<_> = catalog
            .lineage("o1")
            .unwrap()
            .into_iter()
            .map(|e| e.state)
            .collect();
        assert_eq!(lineage, ["discovered", "uploaded", "sealed", "delivered"]);
        assert_eq!(
            catalog.parts("o1").unwrap()[0].ciphertext_sha256.as_deref(),
            Some("c0")
        );
        let row = UsageRow {
            node: "edge@test".into(),
            at: 5,
            seconds: 1.0,
            cpu_percent: 42.5,
            memory_used: 1 << 30,
            disk_read_bps: 1.5e6,
            disk_write_bps: 2.5e6,
            net_rx_bps: 100.0,
            net_tx_bps: 65e6,
        };
        catalog.usage(row.clone()).unwrap();
        assert_eq!(
            catalog.usage_of(Some("edge@test")).unwrap(),
            std::slice::from_ref(&row)
        );
        assert_eq!(catalog.usage_of(None).unwrap(), [row]);
        assert_eq!(
            catalog.failed_attempts(5).unwrap()[0].error,
            "connection reset"
        );
    }

    #[test]
    fn sqlite_catalogue_records_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/catalog.sqlite");
        exercise(&Catalog::open(path.to_str().unwrap()).unwrap());
        // Reopening applies no migration twice and keeps the data.
        let again = Catalog::open(path.to_str().unwrap()).unwrap();
        assert_eq!(again.batches().unwrap().len(), 1);
    }

    /// A catalogue file locked by another process for longer than the busy timeout: the writer
    /// holds its records, retries, and writes every one once the lock is released.
    #[test]
    fn records_wait_out_a_locked_sqlite_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.sqlite");
        let catalog = Catalog::open(path.to_str().unwrap()).unwrap();
        let url = format!("sqlite://{}", path.display());
        let (locked, release) = std::sync::mpsc::channel::<()>();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                use sqlx::Connection;
                let mut conn = AnyConnection::connect(&url).await.unwrap();
                conn.execute("BEGIN EXCLUSIVE").await.unwrap();
                locked.send(()).unwrap();
                release_rx.recv().unwrap();
                conn.execute("COMMIT").await.unwrap();
            });
        });
        release.recv().unwrap();
        for i in 0..100 {
            catalog
                .batch_state(&format!("b{i}"), "edge", "s", "n", 1, 1, "queued")
                .unwrap();
        }
        let flushed = std::sync::atomic::AtomicBool::new(false);
        let flushed_while_locked = std::thread::scope(|scope| {
            scope.spawn(|| {
                catalog.flush().unwrap();
                flushed.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            // Past the 10 s busy timeout: the records are held, not dropped.
            std::thread::sleep(std::time::Duration::from_secs(12));
            let during = flushed.load(std::sync::atomic::Ordering::SeqCst);
            release_tx.send(()).unwrap();
            during
        });
        holder.join().unwrap();
        assert!(
            !flushed_while_locked,
            "the flush returned while the file was locked"
        );
        assert_eq!(catalog.batches().unwrap().len(), 100);
    }

    /// A fresh database on the PostgreSQL server named by `FORTE_TEST_POSTGRES` (`.ci/postgres.sh`
    /// starts one). Without it the test fails in CI and is skipped, loudly, elsewhere.
    pub fn fresh_postgres() -> Option<String> {
        let Ok(base) = std::env::var("FORTE_TEST_POSTGRES") else {
            if std::env::var("CI").is_ok() {
                panic!("FORTE_TEST_POSTGRES is not set: CI must run the PostgreSQL tests (./test.sh starts one)");
            }
            eprintln!("SKIPPED: set FORTE_TEST_POSTGRES=postgres://… (./test.sh does, with .ci/postgres.sh) to run the PostgreSQL test");
            return None;
        };
        sqlx::any::install_default_drivers();
        let name = format!("forte_t_{}", new_id());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let pool = AnyPool::connect(&base)
                .await
                .expect("connecting to FORTE_TEST_POSTGRES");
            pool.execute(format!("CREATE DATABASE {name}").as_str())
                .await
                .unwrap();
        });
        let (prefix, _) = base.rsplit_once('/').expect("a database in the URL");
        Some(format!("{prefix}/{name}"))
    }

    #[test]
    fn postgres_catalogue_records_and_reads_back() {
        let Some(url) = fresh_postgres() else { return };
        exercise(&Catalog::open(&url).unwrap());
        let again = Catalog::open(&url).unwrap();
        assert_eq!(again.batches().unwrap().len(), 1);
        assert!(again.url().contains("***"), "{}", again.url());
    }

    /// Daemons starting together on a fresh catalogue: one migrates, the others wait for it.
    fn open_together(url: &str) {
        std::thread::scope(|scope| {
            let opening: Vec<_> = (0..4).map(|_| scope.spawn(|| Catalog::open(url))).collect();
            for o in opening {
                let catalog = o.join().unwrap().unwrap();
                assert!(catalog.batches().unwrap().is_empty());
            }
        });
    }

    #[test]
    fn fresh_catalogues_opened_together_are_migrated_once() {
        let dir = tempfile::tempdir().unwrap();
        open_together(dir.path().join("c.sqlite").to_str().unwrap());
        if let Some(url) = fresh_postgres() {
            open_together(&url);
        }
    }

    fn one_shot() -> (tempfile::TempDir, Catalog) {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("c.sqlite").to_str().unwrap()).unwrap();
        (dir, catalog)
    }

    fn file(catalog: &Catalog, batch: &str, id: &str, size: u64, state: &str) {
        catalog
            .file_state(
                batch,
                id,
                &format!("{id}.bag"),
                size,
                state,
                None,
                None,
                None,
            )
            .unwrap();
    }

    /// A re-run that discovers again a file the core acknowledged, or fails on it, does not
    /// move it backwards, in its row or its lineage; a failure before delivery is recorded,
    /// and a retry's states follow it.
    #[test]
    fn a_file_state_only_moves_forward() {
        let (_dir, catalog) = one_shot();
        for state in ["discovered", "sealed", "delivered", "acknowledged"] {
            file(&catalog, "b", "o1", 10, state);
        }
        for state in ["discovered", "at_relay", "sealed", "failed", "delivered"] {
            file(&catalog, "b", "o1", 10, state);
        }
        assert_eq!(catalog.files("b").unwrap()[0].state, "acknowledged");
        let lineage: Vec<_> = catalog
            .lineage("o1")
            .unwrap()
            .into_iter()
            .map(|e| e.state)
            .collect();
        assert_eq!(
            lineage,
            ["discovered", "sealed", "delivered", "acknowledged"]
        );

        for state in ["discovered", "failed", "discovered", "sealed"] {
            file(&catalog, "b", "o2", 10, state);
        }
        let states: Vec<_> = catalog
            .lineage("o2")
            .unwrap()
            .into_iter()
            .map(|e| e.state)
            .collect();
        assert_eq!(states, ["discovered", "failed", "discovered", "sealed"]);
        assert_eq!(catalog.files("b").unwrap()[1].state, "sealed");
    }

    /// A batch's totals come from its files and are never lowered by a run that saw (or sent)
    /// only part of it: a re-run that sent nothing does not make it 0 B, a pull that listed 59
    /// of its 150 objects does not make it 59 files.
    #[test]
    fn batch_totals_come_from_its_files_and_never_shrink() {
        let (_dir, catalog) = one_shot();
        catalog
            .batch_state("e", "edge", "", "run-1", 5, 500, "queued")
            .unwrap();
        for i in 0..5 {
            file(&catalog, "e", &format!("o{i}"), 100, "discovered");
        }
        catalog
            .batch_state("e", "edge", "", "run-1", 5, 0, "sent")
            .unwrap();
        // A late file sent as a follow-up, by a run that sees only it.
        file(&catalog, "e", "late", 50, "discovered");
        catalog
            .batch_state("e", "edge", "", "run-1", 1, 50, "sent")
            .unwrap();
        let b = catalog.batch("e").unwrap().unwrap();
        assert_eq!((b.state.as_str(), b.files, b.bytes), ("sent", 6, 550));

        catalog
            .batch_state("c", "core", "site", "run-1", 150, 9000, "pulling")
            .unwrap();
        catalog
            .batch_state("c", "core", "site", "run-1", 59, 3000, "pulling")
            .unwrap();
        for i in 0..59 {
            file(&catalog, "c", &format!("o{i}"), 100, "delivered");
        }
        catalog
            .batch_state("c", "core", "site", "run-1", 59, 3000, "delivered")
            .unwrap();
        let b = catalog.batch("c").unwrap().unwrap();
        // The core's bytes are on the wire: its files' raw sizes do not replace them.
        assert_eq!(
            (b.state.as_str(), b.files, b.bytes),
            ("delivered", 150, 9000)
        );
    }

    /// A batch's state moves forward for its role; a failure may be followed by a retry, but
    /// is not recorded over a batch delivered for good.
    #[test]
    fn a_batch_state_only_moves_forward() {
        let (_dir, catalog) = one_shot();
        let state = |key: &str, role: &str, s: &str| {
            catalog.batch_state(key, role, "", "n", 1, 1, s).unwrap();
            catalog.batch(key).unwrap().unwrap().state
        };
        assert_eq!(state("e", "edge", "sent"), "sent");
        let at = catalog.batch("e").unwrap().unwrap().updated_at;
        assert_eq!(state("e", "edge", "queued"), "sent");
        assert_eq!(state("e", "edge", "sending"), "sent");
        assert_eq!(catalog.batch("e").unwrap().unwrap().updated_at, at);
        assert_eq!(state("e", "edge", "failed"), "failed");
        assert_eq!(state("e", "edge", "queued"), "queued");
        assert_eq!(state("e", "edge", "sent"), "sent");
        assert_eq!(state("e", "edge", "source_deleted"), "source_deleted");
        assert_eq!(state("e", "edge", "failed"), "source_deleted");

        // A file that appears in a batch whose other files were kept sends it again.
        assert_eq!(state("k", "edge", "sent"), "sent");
        assert_eq!(state("k", "edge", "source_kept"), "source_kept");
        assert_eq!(state("k", "edge", "queued"), "queued");

        assert_eq!(state("c", "core", "pulling"), "pulling");
        assert_eq!(state("c", "core", "delivered"), "delivered");
        assert_eq!(state("c", "core", "pulling"), "delivered");
        assert_eq!(state("c", "core", "failed"), "delivered");
    }

    /// A stage spans from its earliest start to its latest end: a re-run's start does not move
    /// it or reopen it.
    #[test]
    fn a_stage_keeps_its_first_start_and_is_not_reopened() {
        let (_dir, catalog) = one_shot();
        let span = || {
            let s = &catalog.stages("b").unwrap()[0];
            (s.started_at, s.ended_at)
        };
        catalog.stage("b", "send", 10, None).unwrap();
        catalog.stage("b", "send", 15, None).unwrap(); // killed, then run again
        assert_eq!(span(), (10, None));
        catalog.stage("b", "send", 15, Some(20)).unwrap();
        assert_eq!(span(), (10, Some(20)));
        catalog.stage("b", "send", 30, None).unwrap();
        assert_eq!(span(), (10, Some(20)), "a later run does not reopen it");
        catalog.stage("b", "send", 30, Some(40)).unwrap();
        assert_eq!(
            span(),
            (10, Some(40)),
            "a follow-up that sent files extends it"
        );
    }

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redact("postgres://forte:s3cret@db:5432/forte"),
            "postgres://forte:***@db:5432/forte"
        );
        assert_eq!(redact("sqlite:///tmp/x.sqlite"), "sqlite:///tmp/x.sqlite");
    }
}
