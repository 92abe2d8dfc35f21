//! The writer thread: records queued by any thread are committed in batches, one transaction
//! for whatever accumulated, and held and retried while the database is unavailable. Here too
//! the statements each record is written with.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use sqlx::{AnyConnection, AnyPool, Row};

use crate::new_id;
use crate::reads::{TunedRow, TuningSample, UsageRow};
use crate::vocabulary::{
    BatchKey, BatchState, FileState, PartState, Role, Stage, Task, TaskOutcome,
};

/// One change to record, with the time it happened.
pub(crate) enum Record {
    Batch(BatchChange),
    File(FileChange),
    Part(PartChange),
    Attempt(AttemptDone),
    TaskRun(TaskRunDone),
    Stage(StageSpan),
    Usage(UsageRow),
    Tuned(TunedRow),
    TuningSample(TuningSample),
}

/// A batch's state and totals, as its node knows them.
pub(crate) struct BatchChange {
    pub(crate) key: BatchKey,
    pub(crate) name: String,
    pub(crate) files: i64,
    pub(crate) bytes: i64,
    pub(crate) state: BatchState,
    pub(crate) at: i64,
    /// When the batch arrived, if known: its row's `created_at` (never later than `at`).
    pub(crate) arrived: Option<i64>,
    pub(crate) detail: Option<String>,
}

/// A file's state, with whatever became known with it.
pub(crate) struct FileChange {
    pub(crate) batch: BatchKey,
    pub(crate) object_id: String,
    pub(crate) carrier: Option<String>,
    pub(crate) path: String,
    pub(crate) size: i64,
    pub(crate) state: FileState,
    pub(crate) raw_sha256: Option<String>,
    pub(crate) delivered_to: Option<String>,
    pub(crate) detail: Option<String>,
    pub(crate) at: i64,
}

/// A part's state and whatever hashes are known.
pub(crate) struct PartChange {
    pub(crate) batch: BatchKey,
    pub(crate) object_id: String,
    pub(crate) index: i64,
    pub(crate) state: PartState,
    pub(crate) raw_sha256: Option<String>,
    pub(crate) ciphertext_sha256: Option<String>,
    pub(crate) ciphertext_length: Option<i64>,
    pub(crate) part_size: Option<i64>,
    pub(crate) at: i64,
}

/// One finished try of a task.
pub(crate) struct AttemptDone {
    pub(crate) task: Task,
    pub(crate) batch: BatchKey,
    pub(crate) object_id: Option<String>,
    pub(crate) part: Option<i64>,
    pub(crate) started_at: i64,
    pub(crate) ended_at: i64,
    pub(crate) error: Option<String>,
}

/// One try of a site's own task.
pub(crate) struct TaskRunDone {
    pub(crate) batch: BatchKey,
    pub(crate) task: String,
    pub(crate) object_id: Option<String>,
    pub(crate) try_number: i64,
    pub(crate) queued_at: i64,
    pub(crate) started_at: i64,
    pub(crate) ended_at: i64,
    pub(crate) outcome: TaskOutcome,
    pub(crate) detail: Option<String>,
}

/// When a stage of a batch started, or (with `ended_at`) ended.
pub(crate) struct StageSpan {
    pub(crate) batch: BatchKey,
    pub(crate) stage: Stage,
    pub(crate) started_at: i64,
    pub(crate) ended_at: Option<i64>,
}

pub(crate) enum Msg {
    Record(Record),
    /// Answered once everything sent before it is committed.
    Flush(Sender<()>),
}

async fn event(
    conn: &mut AnyConnection,
    at: i64,
    batch: &BatchKey,
    object_id: Option<&str>,
    part: Option<i64>,
    state: &str,
    detail: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO events (id, at, batch_key, object_id, part, state, detail) VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(new_id())
        .bind(at)
        .bind(batch.to_string())
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
        Record::Batch(b) => apply_batch(conn, b).await,
        Record::File(f) => apply_file(conn, f).await,
        Record::Part(p) => apply_part(conn, p).await,
        Record::Attempt(a) => insert_attempt(conn, a).await,
        Record::TaskRun(t) => insert_task_run(conn, t).await,
        Record::Stage(s) => widen_stage(conn, s).await,
        Record::Usage(u) => insert_usage(conn, u).await,
        Record::Tuned(t) => upsert_tuned(conn, t).await,
        Record::TuningSample(t) => insert_tuning_sample(conn, t).await,
    }
}

/// Creates or updates a batch's row, and records its state as an event when it moves.
async fn apply_batch(conn: &mut AnyConnection, b: &BatchChange) -> sqlx::Result<()> {
    let stored_key = b.key.to_string();
    let current =
        sqlx::query("SELECT state, files, bytes, updated_at FROM batches WHERE batch_key = $1")
            .bind(&stored_key)
            .fetch_optional(&mut *conn)
            .await?;
    // The totals come from the batch's files: one per path (a file changed in place
    // gets a new object id under the same path), at its largest recorded size. The
    // core's bytes are what went over the wire, which its file rows do not say: there
    // only the callers' figures count. Either way a total is never lowered, so a run
    // that saw part of a batch cannot shrink it.
    let from_files = totals_from_files(conn, &stored_key).await?;
    let (rows_files, rows_bytes) = (from_files.files, from_files.bytes);
    let rows_bytes = if b.key.role() == Role::Edge {
        rows_bytes
    } else {
        0
    };
    let Some(current) = current else {
        let totals = Totals {
            files: b.files.max(rows_files),
            bytes: b.bytes.max(rows_bytes),
        };
        return insert_batch(conn, b, &stored_key, totals).await;
    };
    let (was, was_files, was_bytes, was_at): (String, i64, i64, i64) = (
        current.try_get(0)?,
        current.try_get(1)?,
        current.try_get(2)?,
        current.try_get(3)?,
    );
    let files = b.files.max(rows_files).max(was_files);
    let bytes = b.bytes.max(rows_bytes).max(was_bytes);
    // A state this version does not know (written by a newer one) may be followed.
    let forward = BatchState::parse(&was).is_none_or(|was| was.may_become(b.state));
    let (state, moved) = if forward {
        (b.state.as_str(), was != b.state.as_str())
    } else {
        (was.as_str(), false)
    };
    // The core knows a batch by its id until its manifests are opened: a name that is only
    // the id never replaces the name a pull learned before (a pull that ends as a replay of the
    // same batch never opens them).
    sqlx::query(
        "UPDATE batches SET state = $2, files = $3, bytes = $4,
             name = CASE WHEN $5 = $7 THEN name ELSE $5 END, updated_at = $6
         WHERE batch_key = $1",
    )
    .bind(&stored_key)
    .bind(state)
    .bind(files)
    .bind(bytes)
    .bind(&b.name)
    .bind(if moved { b.at } else { was_at })
    .bind(b.key.batch())
    .execute(&mut *conn)
    .await?;
    // The same state again is an event only when it says something (a detail).
    if moved || (forward && b.detail.is_some()) {
        event(conn, b.at, &b.key, None, None, state, b.detail.as_deref()).await?;
    }
    Ok(())
}

/// A batch's totals: its files and their bytes.
struct Totals {
    files: i64,
    bytes: i64,
}

/// How many distinct paths the batch's file rows hold, and their bytes at each path's
/// largest recorded size.
async fn totals_from_files(conn: &mut AnyConnection, stored_key: &str) -> sqlx::Result<Totals> {
    let from_files = sqlx::query(
        "SELECT COUNT(*), CAST(COALESCE(SUM(s), 0) AS BIGINT)
         FROM (SELECT path, MAX(size) AS s FROM files WHERE batch_key = $1 GROUP BY path) t",
    )
    .bind(stored_key)
    .fetch_one(&mut *conn)
    .await?;
    Ok(Totals {
        files: from_files.try_get(0)?,
        bytes: from_files.try_get(1)?,
    })
}

/// Creates the row of a batch seen for the first time, with `totals`, and records its state as
/// an event.
async fn insert_batch(
    conn: &mut AnyConnection,
    b: &BatchChange,
    stored_key: &str,
    totals: Totals,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO batches (batch_key, role, site, name, state, files, bytes, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(stored_key)
    .bind(b.key.role().as_str())
    .bind(b.key.site())
    .bind(&b.name)
    .bind(b.state.as_str())
    .bind(totals.files)
    .bind(totals.bytes)
    .bind(b.arrived.map_or(b.at, |arrived| arrived.min(b.at)))
    .bind(b.at)
    .execute(&mut *conn)
    .await?;
    event(
        conn,
        b.at,
        &b.key,
        None,
        None,
        b.state.as_str(),
        b.detail.as_deref(),
    )
    .await
}

/// Creates or updates a file's row, and records the change as an event.
async fn apply_file(conn: &mut AnyConnection, f: &FileChange) -> sqlx::Result<()> {
    apply_files(conn, &[f]).await
}

/// Parameter placeholders for statements with hundreds of them: numbered (`$1`) on PostgreSQL,
/// anonymous (`?`) on SQLite, where sqlx finds each numbered parameter's place by its name, a
/// scan of all names, which made 4 500 of them cost more than the statements they replaced.
struct Placeholders {
    numbered: bool,
    given: usize,
}

impl Placeholders {
    fn numbered(conn: &AnyConnection) -> bool {
        conn.backend_name() == "PostgreSQL"
    }

    fn new(numbered: bool) -> Self {
        Self { numbered, given: 0 }
    }

    fn next(&mut self) -> String {
        self.given += 1;
        if self.numbered {
            format!("${}", self.given)
        } else {
            "?".to_owned()
        }
    }

    /// `(p, p, …)` with `width` placeholders.
    fn tuple(&mut self, width: usize) -> String {
        let cells: Vec<String> = (0..width).map(|_| self.next()).collect();
        format!("({})", cells.join(", "))
    }

    /// `count` of [`Placeholders::tuple`] with `width` placeholders each, numbered on from 1: a
    /// statement's `VALUES` list.
    fn values(numbered: bool, count: usize, width: usize) -> String {
        let mut p = Placeholders::new(numbered);
        vec![(); count]
            .iter()
            .map(|()| p.tuple(width))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// File changes written together: each statement binds this many rows at most (9 values each,
/// well under SQLite's 32 766 and PostgreSQL's 65 535 bound parameters).
const FILES_PER_STATEMENT: usize = 500;

/// Records each of `changes` in turn, in three statements: the files'
/// current states read at once, one upsert per file with the outcome of all its changes, and
/// their events inserted together. At 10 000 small files a batch, one statement per change
/// took half the sender's CPU.
async fn apply_files(conn: &mut AnyConnection, changes: &[&FileChange]) -> sqlx::Result<()> {
    let numbered = Placeholders::numbered(conn);
    let current = current_file_states(conn, changes, numbered).await?;
    let writes = merge_file_changes(changes, current);
    if writes.rows.is_empty() {
        return Ok(());
    }
    upsert_file_rows(conn, &writes.rows, numbered).await?;
    if writes.events.is_empty() {
        return Ok(());
    }
    insert_file_events(conn, &writes.events, numbered).await
}

/// A file's row: its stored batch key and its object id.
#[derive(Clone, PartialEq, Eq, Hash)]
struct FileKey {
    batch_key: String,
    object_id: String,
}

impl FileKey {
    fn of(f: &FileChange) -> Self {
        Self {
            batch_key: f.batch.to_string(),
            object_id: f.object_id.clone(),
        }
    }
}

/// The current state of each file `changes` are about (`None`: no row yet), read per batch key
/// (almost always one).
async fn current_file_states(
    conn: &mut AnyConnection,
    changes: &[&FileChange],
    numbered: bool,
) -> sqlx::Result<HashMap<FileKey, Option<String>>> {
    let mut current: HashMap<FileKey, Option<String>> = HashMap::new();
    let mut by_batch: HashMap<String, Vec<&str>> = HashMap::new();
    for f in changes {
        let key = FileKey::of(f);
        let batch = key.batch_key.clone();
        if current.insert(key, None).is_none() {
            by_batch.entry(batch).or_default().push(&f.object_id);
        }
    }
    for (batch, objects) in &by_batch {
        let mut p = Placeholders::new(numbered);
        let sql = format!(
            "SELECT object_id, state FROM files WHERE batch_key = {} AND object_id IN {}",
            p.next(),
            p.tuple(objects.len())
        );
        let mut query = sqlx::query(&sql).bind(batch);
        for object in objects {
            query = query.bind(*object);
        }
        for row in query.fetch_all(&mut *conn).await? {
            let (object, state): (String, String) = (row.try_get(0)?, row.try_get(1)?);
            let key = FileKey {
                batch_key: batch.clone(),
                object_id: object,
            };
            current.insert(key, Some(state));
        }
    }
    Ok(current)
}

/// A file's row as all its changes in one statement leave it: the first change's path and
/// size, the last one's state and time, and the last known hash, destination and carrier.
struct MergedRow<'a> {
    first: &'a FileChange,
    last: &'a FileChange,
    raw_sha256: Option<&'a str>,
    delivered_to: Option<&'a str>,
    carrier: Option<&'a str>,
}

/// What a run of file changes writes: one row per file, and the changes that go into the
/// files' lineages.
struct FileWrites<'a> {
    rows: Vec<MergedRow<'a>>,
    events: Vec<&'a FileChange>,
}

/// Folds `changes` in order over the files' `current` states into the rows and events to
/// write.
fn merge_file_changes<'a>(
    changes: &[&'a FileChange],
    mut current: HashMap<FileKey, Option<String>>,
) -> FileWrites<'a> {
    // A state that would move the file backwards (a re-run discovering a file the core
    // already acknowledged, a failed attempt after a delivery) is not recorded, neither on
    // the row nor in its lineage.
    let mut rows: Vec<MergedRow> = Vec::new();
    let mut row_of: HashMap<FileKey, usize> = HashMap::new();
    let mut events: Vec<&FileChange> = Vec::new();
    for &f in changes {
        let k = FileKey::of(f);
        let was = current.get(&k).cloned().flatten();
        if let Some(was) = was.as_deref().and_then(FileState::parse) {
            if !was.may_become(f.state) {
                continue;
            }
        }
        match row_of.get(&k) {
            Some(&i) => {
                let row = &mut rows[i];
                row.last = f;
                row.raw_sha256 = f.raw_sha256.as_deref().or(row.raw_sha256);
                row.delivered_to = f.delivered_to.as_deref().or(row.delivered_to);
                row.carrier = f.carrier.as_deref().or(row.carrier);
            }
            None => {
                row_of.insert(k.clone(), rows.len());
                rows.push(MergedRow {
                    first: f,
                    last: f,
                    raw_sha256: f.raw_sha256.as_deref(),
                    delivered_to: f.delivered_to.as_deref(),
                    carrier: f.carrier.as_deref(),
                });
            }
        }
        // The same state again is an event only when it says something (a detail).
        if was.as_deref() != Some(f.state.as_str()) || f.detail.is_some() {
            events.push(f);
        }
        current.insert(k, Some(f.state.as_str().to_owned()));
    }
    FileWrites { rows, events }
}

/// Creates or updates the files' `rows` in one statement.
async fn upsert_file_rows(
    conn: &mut AnyConnection,
    rows: &[MergedRow<'_>],
    numbered: bool,
) -> sqlx::Result<()> {
    let sql = format!(
        "INSERT INTO files (object_id, batch_key, path, size, raw_sha256, delivered_to, state, updated_at, carrier)
         VALUES {}
         ON CONFLICT (batch_key, object_id) DO UPDATE SET state = excluded.state,
             raw_sha256 = COALESCE(excluded.raw_sha256, files.raw_sha256),
             delivered_to = COALESCE(excluded.delivered_to, files.delivered_to),
             carrier = COALESCE(excluded.carrier, files.carrier),
             updated_at = excluded.updated_at",
        Placeholders::values(numbered, rows.len(), 9)
    );
    let mut query = sqlx::query(&sql);
    for row in rows {
        query = query
            .bind(&row.first.object_id)
            .bind(row.first.batch.to_string())
            .bind(&row.first.path)
            .bind(row.first.size)
            .bind(row.raw_sha256)
            .bind(row.delivered_to)
            .bind(row.last.state.as_str())
            .bind(row.last.at)
            .bind(row.carrier);
    }
    query.execute(&mut *conn).await.map(drop)
}

/// Inserts the files' `events` in one statement.
async fn insert_file_events(
    conn: &mut AnyConnection,
    events: &[&FileChange],
    numbered: bool,
) -> sqlx::Result<()> {
    let sql = format!(
        "INSERT INTO events (id, at, batch_key, object_id, part, state, detail) VALUES {}",
        Placeholders::values(numbered, events.len(), 7)
    );
    let mut query = sqlx::query(&sql);
    for f in events {
        query = query
            .bind(new_id())
            .bind(f.at)
            .bind(f.batch.to_string())
            .bind(Some(f.object_id.as_str()))
            .bind(None::<i64>)
            .bind(f.state.as_str())
            .bind(f.detail.as_deref());
    }
    query.execute(&mut *conn).await.map(drop)
}

/// Creates or updates a part's row, keeping hashes known before, and records the change as
/// an event.
async fn apply_part(conn: &mut AnyConnection, p: &PartChange) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO parts (object_id, idx, raw_sha256, ciphertext_sha256, ciphertext_length, part_size, state, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (object_id, idx) DO UPDATE SET state = excluded.state,
             raw_sha256 = COALESCE(excluded.raw_sha256, parts.raw_sha256),
             ciphertext_sha256 = COALESCE(excluded.ciphertext_sha256, parts.ciphertext_sha256),
             ciphertext_length = COALESCE(excluded.ciphertext_length, parts.ciphertext_length),
             part_size = COALESCE(excluded.part_size, parts.part_size),
             updated_at = excluded.updated_at",
    )
    .bind(&p.object_id)
    .bind(p.index)
    .bind(p.raw_sha256.as_deref())
    .bind(p.ciphertext_sha256.as_deref())
    .bind(p.ciphertext_length)
    .bind(p.part_size)
    .bind(p.state.as_str())
    .bind(p.at)
    .execute(&mut *conn)
    .await?;
    let (object_id, index) = (Some(p.object_id.as_str()), Some(p.index));
    event(
        conn,
        p.at,
        &p.batch,
        object_id,
        index,
        p.state.as_str(),
        None,
    )
    .await
}

/// Records one finished try of a task, its outcome `failed` when it has an error.
async fn insert_task_run(conn: &mut AnyConnection, t: &TaskRunDone) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO task_runs (id, batch_key, task, object_id, try_number, queued_at, started_at, ended_at, outcome, detail)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(new_id())
    .bind(t.batch.to_string())
    .bind(&t.task)
    .bind(t.object_id.as_deref())
    .bind(t.try_number)
    .bind(t.queued_at)
    .bind(t.started_at)
    .bind(t.ended_at)
    .bind(t.outcome.as_str())
    .bind(t.detail.as_deref())
    .execute(&mut *conn)
    .await?;
    let state = format!("task {}: {}", t.task, t.outcome);
    let (object_id, detail) = (t.object_id.as_deref(), t.detail.as_deref());
    event(conn, t.ended_at, &t.batch, object_id, None, &state, detail).await
}

async fn insert_attempt(conn: &mut AnyConnection, a: &AttemptDone) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO attempts (id, task, batch_key, object_id, part, started_at, ended_at, outcome, error)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(new_id())
    .bind(a.task.as_str())
    .bind(a.batch.to_string())
    .bind(a.object_id.as_deref())
    .bind(a.part)
    .bind(a.started_at)
    .bind(a.ended_at)
    .bind(if a.error.is_some() { "failed" } else { "ok" })
    .bind(a.error.as_deref())
    .execute(conn)
    .await
    .map(drop)
}

/// Records a stage's span, widened to cover what is already recorded: the earliest start, the
/// latest end, and an end once known is never cleared.
async fn widen_stage(conn: &mut AnyConnection, s: &StageSpan) -> sqlx::Result<()> {
    sqlx::query(
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
    .bind(s.batch.to_string())
    .bind(s.stage.as_str())
    .bind(s.started_at)
    .bind(s.ended_at)
    .execute(conn)
    .await
    .map(drop)
}

/// Records one utilisation sample; a second sample of a node at the same time is ignored.
/// The first sample of each minute also rolls the node's history up
/// ([`roll_up_usage`]).
async fn insert_usage(conn: &mut AnyConnection, u: &UsageRow) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO usage (node, at, seconds, cpu_percent, memory_used, disk_read_bps, disk_write_bps, net_rx_bps, net_tx_bps, own_cpu_percent, own_memory, latency_items, latency_p50_ms, latency_p87_ms, latency_p99_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) ON CONFLICT (node, at) DO NOTHING",
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
    .bind(u.own_cpu_percent)
    .bind(u.own_memory)
    .bind(u.item_latency.items)
    .bind(u.item_latency.p50_ms)
    .bind(u.item_latency.p87_ms)
    .bind(u.item_latency.p99_ms)
    .execute(&mut *conn)
    .await?;
    let previous = u.at - (u.seconds * 1e6) as i64;
    if previous.div_euclid(MINUTE_US) != u.at.div_euclid(MINUTE_US) {
        roll_up_usage(conn, &u.node, u.at).await?;
    }
    Ok(())
}

const MINUTE_US: i64 = 60_000_000;
const HOUR_US: i64 = 60 * MINUTE_US;
/// How long 1-s samples are kept, and how long their 1-min rollups are (1-h rollups are kept
/// for good): a year of a node's history is some 55 000 rows, not 31.5 million. Prometheus
/// (`/metrics`) is the place for long, fine history.
pub(crate) const SECONDS_KEPT_US: i64 = 24 * HOUR_US;
pub(crate) const MINUTES_KEPT_US: i64 = 30 * 24 * HOUR_US;

/// Rolls `node`'s samples older than a day (before its sample at `now`) into 1-min rollups,
/// and 1-min rollups older than 30 days into 1-h ones, whole minutes and hours only, and
/// deletes what was rolled up. Rates and CPU are averaged; memory and latency percentiles are
/// the largest; seconds and items add up.
async fn roll_up_usage(conn: &mut AnyConnection, node: &str, now: i64) -> sqlx::Result<()> {
    const AGGREGATES: &str = "SUM(seconds), AVG(cpu_percent), MAX(memory_used), AVG(disk_read_bps), AVG(disk_write_bps), AVG(net_rx_bps), AVG(net_tx_bps), AVG(own_cpu_percent), MAX(own_memory), SUM(latency_items), MAX(latency_p50_ms), MAX(latency_p87_ms), MAX(latency_p99_ms)";
    const INTO: &str = "INSERT INTO usage_rollups (node, resolution_s, at, seconds, cpu_percent, memory_used, disk_read_bps, disk_write_bps, net_rx_bps, net_tx_bps, own_cpu_percent, own_memory, latency_items, latency_p50_ms, latency_p87_ms, latency_p99_ms)";
    let minutes_before = (now - SECONDS_KEPT_US).div_euclid(MINUTE_US) * MINUTE_US;
    let hours_before = (now - MINUTES_KEPT_US).div_euclid(HOUR_US) * HOUR_US;
    let steps = [
        (
            format!("{INTO} SELECT node, 60, (at / {MINUTE_US}) * {MINUTE_US}, {AGGREGATES} FROM usage WHERE node = $1 AND at < $2 GROUP BY node, at / {MINUTE_US} ON CONFLICT (node, resolution_s, at) DO NOTHING"),
            "DELETE FROM usage WHERE node = $1 AND at < $2".to_string(),
            minutes_before,
        ),
        (
            format!("{INTO} SELECT node, 3600, (at / {HOUR_US}) * {HOUR_US}, {AGGREGATES} FROM usage_rollups WHERE node = $1 AND resolution_s = 60 AND at < $2 GROUP BY node, at / {HOUR_US} ON CONFLICT (node, resolution_s, at) DO NOTHING"),
            "DELETE FROM usage_rollups WHERE node = $1 AND resolution_s = 60 AND at < $2".to_string(),
            hours_before,
        ),
    ];
    for (roll, delete, before) in steps {
        for sql in [roll, delete] {
            sqlx::query(&sql)
                .bind(node)
                .bind(before)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(())
}

/// Keeps the setting that worked for a relay, cluster and hour, replacing an older one.
async fn upsert_tuned(conn: &mut AnyConnection, t: &TunedRow) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO tuning (relay, cluster, hour, uploads, goodput, at) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (relay, cluster, hour) DO UPDATE SET uploads = excluded.uploads, goodput = excluded.goodput, at = excluded.at",
    )
    .bind(&t.relay)
    .bind(&t.cluster)
    .bind(t.hour)
    .bind(t.uploads)
    .bind(t.goodput)
    .bind(t.at)
    .execute(conn)
    .await
    .map(drop)
}

/// Records one interval of a send's tuning; a second one of a node at the same time is
/// ignored.
async fn insert_tuning_sample(conn: &mut AnyConnection, t: &TuningSample) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO tuning_samples (node, at, uploads, level, goodput, reason) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (node, at) DO NOTHING",
    )
    .bind(&t.node)
    .bind(t.at)
    .bind(t.uploads)
    .bind(t.level)
    .bind(t.goodput)
    .bind(&t.reason)
    .execute(conn)
    .await
    .map(drop)
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

/// Why records were not all committed: the database is unavailable ([`unavailable`]), after
/// the first `committed` of them were.
#[derive(Debug)]
struct Interrupted {
    committed: usize,
    error: sqlx::Error,
}

/// Commits `records` in one transaction; if the database refuses that, record by record, so
/// one bad record costs only itself (reported on stderr: the transfer goes on). Fails only when
/// the database is unavailable, with how many leading records are already committed.
async fn commit(
    pool: &AnyPool,
    records: &[Record],
    sqlite: bool,
) -> std::result::Result<(), Interrupted> {
    let together = async {
        // SQLite: take the write lock at the start. A deferred transaction that read first
        // fails at its first write, without waiting, once another connection (a lease
        // renewed meanwhile) has written (SQLITE_BUSY_SNAPSHOT); an immediate one waits for
        // the lock like any writer.
        let mut tx = if sqlite {
            pool.begin_with("BEGIN IMMEDIATE").await?
        } else {
            pool.begin().await?
        };
        // Runs of file changes (a batch's thousands of small files) go in a few statements;
        // everything else one record at a time.
        for run in records.chunk_by(|a, b| matches!((a, b), (Record::File(_), Record::File(_)))) {
            match run {
                [Record::File(_), ..] => {
                    let files: Vec<&FileChange> = run
                        .iter()
                        .filter_map(|r| match r {
                            Record::File(f) => Some(f),
                            _ => None,
                        })
                        .collect();
                    for chunk in files.chunks(FILES_PER_STATEMENT) {
                        apply_files(&mut tx, chunk).await?;
                    }
                }
                _ => {
                    for r in run {
                        apply(&mut tx, r).await?;
                    }
                }
            }
        }
        tx.commit().await
    };
    match together.await {
        Ok(()) => return Ok(()),
        Err(error) if unavailable(&error) => {
            return Err(Interrupted {
                committed: 0,
                error,
            })
        }
        Err(_) => {}
    }
    for (done, r) in records.iter().enumerate() {
        let result = async { apply(&mut *pool.acquire().await?, r).await }.await;
        match result {
            Ok(()) => {}
            Err(error) if unavailable(&error) => {
                return Err(Interrupted {
                    committed: done,
                    error,
                })
            }
            Err(e) => tracing::warn!("catalogue: a record was not written: {e}"),
        }
    }
    Ok(())
}

/// Records queued for the writer before `submit` blocks. While the database is unavailable the
/// writer holds what it has and stops taking more, so a long outage makes the daemons wait here
/// with bounded memory instead of dropping their history.
pub(crate) const QUEUE_CAPACITY: usize = 20_000;

/// Most records in one transaction.
const RECORDS_PER_COMMIT: usize = 5_000;

/// The writer thread's loop: commits what `inbox` brings until every sender is gone.
pub(crate) fn run(
    runtime: Arc<tokio::runtime::Runtime>,
    pool: AnyPool,
    url: String,
    inbox: Receiver<Msg>,
) {
    let (mut records, mut flushes) = (Vec::new(), Vec::new());
    let sqlite = !crate::is_postgres(&url);
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
            if let Err(Interrupted {
                committed: done,
                error: e,
            }) = runtime.block_on(commit(&pool, &records, sqlite))
            {
                records.drain(..done);
                let (since, delay) = outage.get_or_insert((
                    std::time::Instant::now(),
                    std::time::Duration::from_millis(250),
                ));
                tracing::warn!("catalogue {url} unavailable for {:.0} s ({e}); holding {} records, retrying in {:.1} s",
                    since.elapsed().as_secs_f64(),
                    records.len(),
                    delay.as_secs_f64()
                );
                std::thread::sleep(*delay);
                *delay = (*delay * 2).min(std::time::Duration::from_secs(10));
                continue;
            }
            if let Some((since, _)) = outage.take() {
                tracing::warn!(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Catalog;

    fn change(batch: &str, object: &str, state: FileState) -> FileChange {
        FileChange {
            batch: BatchKey::edge(batch),
            object_id: object.into(),
            carrier: None,
            path: format!("{object}.csv"),
            size: 10,
            state,
            raw_sha256: None,
            delivered_to: None,
            detail: None,
            at: 0,
        }
    }

    /// Rows and lineages as text, without the times and ids that differ from run to run.
    fn contents(catalog: &Catalog) -> (Vec<String>, Vec<String>) {
        catalog.runtime.block_on(async {
            let rows = sqlx::query(
                "SELECT batch_key, object_id, path, size, raw_sha256, delivered_to, state, carrier
                 FROM files ORDER BY batch_key, object_id",
            )
            .fetch_all(&catalog.pool)
            .await
            .unwrap();
            let files = rows
                .iter()
                .map(|r| {
                    let text = |i| r.try_get::<Option<String>, _>(i).unwrap();
                    let size: i64 = r.try_get(3).unwrap();
                    format!(
                        "{:?} {:?} {:?} {size} {:?} {:?} {:?} {:?}",
                        text(0), text(1), text(2), text(4), text(5), text(6), text(7)
                    )
                })
                .collect();
            let rows = sqlx::query(
                "SELECT batch_key, object_id, state, detail FROM events ORDER BY at, batch_key, object_id",
            )
            .fetch_all(&catalog.pool)
            .await
            .unwrap();
            let events = rows
                .iter()
                .map(|r| {
                    let text = |i| r.try_get::<Option<String>, _>(i).unwrap();
                    format!("{:?} {:?} {:?} {:?}", text(0), text(1), text(2), text(3))
                })
                .collect();
            (files, events)
        })
    }

    /// File changes committed together (the writer's runs of thousands) leave exactly the rows
    /// and lineages that the same changes committed one by one do: backward steps skipped,
    /// repeated states without a detail not in the lineage, hashes and destinations kept once
    /// known, the same object id in two batches apart.
    #[test]
    fn file_changes_committed_together_equal_one_by_one() {
        use FileState::*;
        let mut changes = Vec::new();
        let mut at = 1;
        let mut push = |mut c: FileChange, edit: &dyn Fn(&mut FileChange)| {
            edit(&mut c);
            c.at = at;
            at += 1;
            changes.push(Record::File(c));
        };
        let none = |_: &mut FileChange| {};
        push(change("b1", "o3", Acknowledged), &none);
        push(change("b1", "o1", Discovered), &none);
        push(change("b1", "o2", Discovered), &none);
        push(change("b1", "o1", Sealed), &|c| {
            c.raw_sha256 = Some("h1".into())
        });
        push(change("b1", "o3", Discovered), &none);
        push(change("b1", "o2", Failed), &|c| {
            c.detail = Some("part 0: refused".into())
        });
        push(change("b1", "o1", Discovered), &none);
        push(change("b2", "o1", Discovered), &|c| {
            c.carrier = Some("k".into())
        });
        push(change("b1", "o2", Discovered), &none);
        push(change("b1", "o1", Delivered), &|c| {
            c.delivered_to = Some("wan/o1.csv".into())
        });
        push(change("b1", "o2", Sealed), &none);
        push(change("b1", "o2", Sealed), &none);
        push(change("b1", "o2", Sealed), &|c| {
            c.detail = Some("again".into())
        });
        push(change("b1", "o1", Acknowledged), &none);

        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| Catalog::open(dir.path().join(name).to_str().unwrap()).unwrap();
        let (together, one_by_one) = (open("together.sqlite"), open("one.sqlite"));
        together
            .runtime
            .block_on(commit(&together.pool, &changes, true))
            .unwrap();
        for record in &changes {
            let one = std::slice::from_ref(record);
            one_by_one
                .runtime
                .block_on(commit(&one_by_one.pool, one, true))
                .unwrap();
        }
        let (files, events) = contents(&together);
        assert_eq!(
            (&files, &events),
            (&contents(&one_by_one).0, &contents(&one_by_one).1)
        );
        assert_eq!(files.len(), 4, "{files:#?}");
        assert!(
            files[0].contains("\"h1\"")
                && files[0].contains("\"wan/o1.csv\"")
                && files[0].contains("\"acknowledged\""),
            "{files:#?}"
        );
        assert_eq!(events.len(), 11, "{events:#?}");
    }
}
