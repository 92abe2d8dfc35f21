//! The writer thread: records queued by any thread are committed in batches, one transaction
//! for whatever accumulated, and held and retried while the database is unavailable.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use sqlx::{AnyConnection, AnyPool, Row};

use crate::new_id;
use crate::reads::UsageRow;
use crate::vocabulary::{BatchKey, BatchState, FileState, PartState, Role, Stage, Task};

/// One change to record, with the time it happened.
pub(crate) enum Record {
    Batch {
        key: BatchKey,
        name: String,
        files: i64,
        bytes: i64,
        state: BatchState,
        at: i64,
    },
    File {
        batch: BatchKey,
        object_id: String,
        path: String,
        size: i64,
        state: FileState,
        raw_sha256: Option<String>,
        delivered_to: Option<String>,
        detail: Option<String>,
        at: i64,
    },
    Part {
        batch: BatchKey,
        object_id: String,
        index: i64,
        state: PartState,
        raw_sha256: Option<String>,
        ciphertext_sha256: Option<String>,
        ciphertext_length: Option<i64>,
        at: i64,
    },
    Attempt {
        task: Task,
        batch: BatchKey,
        object_id: Option<String>,
        part: Option<i64>,
        started_at: i64,
        ended_at: i64,
        error: Option<String>,
    },
    Stage {
        batch: BatchKey,
        stage: Stage,
        started_at: i64,
        ended_at: Option<i64>,
    },
    Usage(UsageRow),
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
        Record::Batch { key, name, files, bytes, state, at } => {
            let stored_key = key.to_string();
            let current = sqlx::query("SELECT state, files, bytes, updated_at FROM batches WHERE batch_key = $1")
                .bind(&stored_key)
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
            .bind(&stored_key)
            .fetch_one(&mut *conn)
            .await?;
            let (rows_files, rows_bytes): (i64, i64) = (from_files.try_get(0)?, from_files.try_get(1)?);
            let rows_bytes = if key.role() == Role::Edge { rows_bytes } else { 0 };
            let Some(current) = current else {
                sqlx::query(
                    "INSERT INTO batches (batch_key, role, site, name, state, files, bytes, created_at, updated_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
                )
                .bind(&stored_key)
                .bind(key.role().as_str())
                .bind(key.site())
                .bind(name)
                .bind(state.as_str())
                .bind((*files).max(rows_files))
                .bind((*bytes).max(rows_bytes))
                .bind(at)
                .execute(&mut *conn)
                .await?;
                return event(conn, *at, key, None, None, state.as_str(), None).await;
            };
            let (was, was_files, was_bytes, was_at): (String, i64, i64, i64) = (
                current.try_get(0)?,
                current.try_get(1)?,
                current.try_get(2)?,
                current.try_get(3)?,
            );
            let files = (*files).max(rows_files).max(was_files);
            let bytes = (*bytes).max(rows_bytes).max(was_bytes);
            // A state this version does not know (written by a newer one) may be followed.
            let forward = BatchState::parse(&was).is_none_or(|was| was.may_become(*state));
            let (state, moved) = if forward {
                (state.as_str(), was != state.as_str())
            } else {
                (was.as_str(), false)
            };
            sqlx::query(
                "UPDATE batches SET state = $2, files = $3, bytes = $4, name = $5, updated_at = $6
                 WHERE batch_key = $1",
            )
            .bind(&stored_key)
            .bind(state)
            .bind(files)
            .bind(bytes)
            .bind(name)
            .bind(if moved { *at } else { was_at })
            .execute(&mut *conn)
            .await?;
            if moved {
                event(conn, *at, key, None, None, state, None).await?;
            }
            Ok(())
        }
        Record::File { batch, object_id, path, size, state, raw_sha256, delivered_to, detail, at } => {
            let stored_key = batch.to_string();
            let current: Option<String> =
                sqlx::query("SELECT state FROM files WHERE batch_key = $1 AND object_id = $2")
                    .bind(&stored_key)
                    .bind(object_id)
                    .fetch_optional(&mut *conn)
                    .await?
                    .map(|r| r.try_get(0))
                    .transpose()?;
            // A state that would move the file backwards (a re-run discovering a file the
            // core already acknowledged, a failed attempt after a delivery) is not recorded,
            // neither on the row nor in its lineage.
            if let Some(was) = current.as_deref().and_then(FileState::parse) {
                if !was.may_become(*state) {
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
            .bind(&stored_key)
            .bind(path)
            .bind(size)
            .bind(raw_sha256.as_deref())
            .bind(delivered_to.as_deref())
            .bind(state.as_str())
            .bind(at)
            .execute(&mut *conn)
            .await?;
            // The same state again is an event only when it says something (a detail).
            if current.as_deref() == Some(state.as_str()) && detail.is_none() {
                return Ok(());
            }
            event(conn, *at, batch, Some(object_id), None, state.as_str(), detail.as_deref()).await
        }
        Record::Part { batch, object_id, index, state, raw_sha256, ciphertext_sha256, ciphertext_length, at } => {
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
            .bind(state.as_str())
            .bind(at)
            .execute(&mut *conn)
            .await?;
            event(conn, *at, batch, Some(object_id), Some(*index), state.as_str(), None).await
        }
        Record::Attempt { task, batch, object_id, part, started_at, ended_at, error } => sqlx::query(
            "INSERT INTO attempts (id, task, batch_key, object_id, part, started_at, ended_at, outcome, error)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(new_id())
        .bind(task.as_str())
        .bind(batch.to_string())
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
        Record::Stage { batch, stage, started_at, ended_at } => sqlx::query(
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
        .bind(batch.to_string())
        .bind(stage.as_str())
        .bind(started_at)
        .bind(ended_at)
        .execute(conn)
        .await
        .map(drop),
    }
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
pub(crate) const QUEUE_CAPACITY: usize = 20_000;

/// Most records in one transaction.
const RECORDS_PER_COMMIT: usize = 5_000;

pub(crate) fn writer(
    runtime: Arc<tokio::runtime::Runtime>,
    pool: AnyPool,
    url: String,
    inbox: Receiver<Msg>,
) {
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
