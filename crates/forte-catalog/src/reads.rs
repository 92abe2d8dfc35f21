//! Reading: rows as the catalogue knows them, each read after this process's queued writes.

use anyhow::{Context, Result};
use serde::Serialize;
use sqlx::any::{AnyArguments, AnyRow};
use sqlx::Row;

use crate::vocabulary::{BatchKey, BatchState, FileState, PartState, Role, Stage, TaskOutcome};
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

/// A file first seen in a batch after the batch's first send ended (at the edge: its first
/// `sent`) or after its first delivery (at the core: its first `delivered`): a late file, sent
/// as a follow-up sealed into the same batch. [`Catalog::follow_ups`] reads them.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FollowUpRow {
    pub batch_key: BatchKey,
    pub object_id: String,
    pub path: String,
    pub size: i64,
    /// When the batch's first send ended (edge) or its first delivery was recorded (core).
    pub batch_done_at: i64,
    /// The file's first event in this batch, its parts' included (at the edge: when it was
    /// discovered; at the core: its first part verified).
    pub first_at: i64,
    /// Its `delivered` event, if any (the core's).
    pub delivered_at: Option<i64>,
    /// The batch's last event before the first event of any of its late files: as near as the
    /// events tell, when the task that carried its first files (the first pull, at the core)
    /// ended.
    pub before_late: Option<i64>,
}

/// Resource utilisation of one node over one interval ending at `at`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
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
    /// The sampling process's parts' latency from read to sink, since it started.
    pub item_latency: ItemLatency,
    pub disk_read_bps: f64,
    pub disk_write_bps: f64,
    pub net_rx_bps: f64,
    pub net_tx_bps: f64,
}

/// Percentiles of a process's parts' latency from read to sink, since it started (0 in samples
/// taken before forte kept them, or before any part reached the sink).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct ItemLatency {
    pub items: i64,
    pub p50_ms: f64,
    pub p87_ms: f64,
    pub p99_ms: f64,
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

/// One try of a site's own task: `task_runs`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TaskRunRow {
    pub batch_key: BatchKey,
    pub task: String,
    pub object_id: Option<String>,
    pub try_number: i64,
    pub queued_at: i64,
    pub started_at: i64,
    pub ended_at: i64,
    pub outcome: TaskOutcome,
    pub detail: Option<String>,
}

/// A part's state and hashes.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PartRow {
    pub index: i64,
    pub state: PartState,
    pub raw_sha256: Option<String>,
    pub ciphertext_sha256: Option<String>,
    /// The raw bytes per part its object was cut into, recorded when it was uploaded.
    pub part_size: Option<i64>,
}

/// A failure: a failed attempt of a task, or a file or batch recorded as failed (or damaged)
/// with its error.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Failure {
    /// When it ended, or was recorded.
    pub at: i64,
    /// The task that failed (`upload`, `seal`, `download`, `task NAME` for a site's own), or
    /// `file` or `batch` for a state recorded with its error.
    pub task: String,
    pub batch_key: BatchKey,
    pub object_id: Option<String>,
    pub part: Option<i64>,
    pub error: String,
}

/// Which batches or files to read: all by default, newest change first.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// The name (a batch's) or the path or delivered path (a file's) contains this, whatever
    /// the case (on SQLite and PostgreSQL alike).
    pub name: Option<String>,
    /// The name (a batch's) matches this glob whatever the case: `*` any text, `?` one
    /// character, anything else itself. Five sites naming runs by date need a whole-name match,
    /// not `name`'s "contains".
    pub pattern: Option<String>,
    /// Of the batch of exactly this name (by `batches_by_name`).
    pub batch: Option<String>,
    /// Of this site only (at the core: the site that sent it; an edge's rows have no site).
    pub site: Option<String>,
    /// In this state (the text of [`BatchState`] or [`FileState`]).
    pub state: Option<String>,
    pub role: Option<Role>,
    /// Changed at or after this time.
    pub since: Option<i64>,
    /// Changed at or before this time.
    pub until: Option<i64>,
    /// At most this many.
    pub limit: Option<i64>,
}

/// The columns a [`Filter`] reads, which differ between batches and files.
struct FilterColumns {
    /// A condition on the name, `#` where its pattern goes (used once, or more as `#`).
    name: &'static str,
    /// A condition on the batch's name, `#` where it goes.
    batch: &'static str,
    /// A condition on the site, `#` where the site goes (exactly, whatever the back end).
    site: &'static str,
    /// The condition for each role.
    role: fn(Role) -> &'static str,
    updated: &'static str,
}

/// A `WHERE` clause (empty when nothing is filtered) and the values of its numbered
/// placeholders, from 1.
struct WhereClause {
    sql: String,
    values: Vec<FilterValue>,
}

impl Filter {
    /// The WHERE clause and its values (numbered placeholders, from 1).
    fn clause(&self, columns: &FilterColumns) -> WhereClause {
        let mut terms: Vec<String> = vec![];
        let mut values = vec![];
        let mut term = |sql: &str, value: Option<FilterValue>| {
            let sql = match value {
                Some(value) => {
                    values.push(value);
                    sql.replace('#', &format!("${}", values.len()))
                }
                None => sql.to_owned(),
            };
            terms.push(sql);
        };
        if let Some(name) = &self.name {
            // Matched literally: LIKE's wildcards in the text match themselves.
            let escaped = like_literal(name);
            term(
                columns.name,
                Some(FilterValue::Text(format!("%{escaped}%"))),
            );
        }
        if let Some(pattern) = &self.pattern {
            let like = like_literal(pattern).replace('*', "%").replace('?', "_");
            term(columns.name, Some(FilterValue::Text(like)));
        }
        if let Some(batch) = &self.batch {
            term(columns.batch, Some(FilterValue::Text(batch.clone())));
        }
        if let Some(site) = &self.site {
            term(columns.site, Some(FilterValue::Text(site.clone())));
        }
        if let Some(state) = &self.state {
            term("state = #", Some(FilterValue::Text(state.clone())));
        }
        if let Some(role) = self.role {
            term((columns.role)(role), None);
        }
        let updated_since = format!("{} >= #", columns.updated);
        let updated_until = format!("{} <= #", columns.updated);
        if let Some(since) = self.since {
            term(&updated_since, Some(FilterValue::Int(since)));
        }
        if let Some(until) = self.until {
            term(&updated_until, Some(FilterValue::Int(until)));
        }
        let sql = if terms.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", terms.join(" AND "))
        };
        WhereClause { sql, values }
    }

    /// The query `select` with this filter, newest change first.
    fn query<'q>(&self, select: &str, columns: &FilterColumns, sql: &'q mut String) -> Query<'q> {
        let WhereClause {
            sql: clause,
            values,
        } = self.clause(columns);
        let limit = self.limit.unwrap_or(i64::MAX).max(0);
        *sql = format!(
            "{select}{clause} ORDER BY {} DESC LIMIT {limit}",
            columns.updated
        );
        bound(sqlx::query(sql.as_str()), values)
    }
}

/// `query` with `values` bound to its placeholders, in order.
fn bound(mut query: Query<'_>, values: Vec<FilterValue>) -> Query<'_> {
    for value in values {
        query = match value {
            FilterValue::Text(text) => query.bind(text),
            FilterValue::Int(int) => query.bind(int),
        };
    }
    query
}

/// How many batches of one site are in one state, with their files and bytes: a line of the
/// summary `forte status` opens with.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BatchCount {
    pub site: String,
    pub role: Role,
    pub state: BatchState,
    pub batches: i64,
    pub files: i64,
    pub bytes: i64,
}

impl Filter {
    /// The batches this filter matches (its limit aside), counted by site, role and state.
    fn counts<'q>(&self, sql: &'q mut String) -> Query<'q> {
        let WhereClause {
            sql: clause,
            values,
        } = self.clause(&BATCH_FILTER);
        // SUM is NUMERIC on PostgreSQL: cast back to what every back end reads as an integer.
        *sql = format!("SELECT site, role, state, COUNT(*), CAST(COALESCE(SUM(files), 0) AS BIGINT), CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM batches{clause} GROUP BY site, role, state ORDER BY site, role, state");
        bound(sqlx::query(sql.as_str()), values)
    }
}

/// `text` as a LIKE pattern that matches it literally (ESCAPE '\\').
fn like_literal(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
}

const BATCH_FILTER: FilterColumns = FilterColumns {
    name: "LOWER(name) LIKE LOWER(#) ESCAPE '\\'",
    batch: "name = #",
    site: "site = #",
    role: |role| match role {
        Role::Edge => "role = 'edge'",
        Role::Core => "role = 'core'",
    },
    updated: "updated_at",
};

/// A file's role is its batch key's: the core's has a site and a slash.
const FILE_FILTER: FilterColumns = FilterColumns {
    name:
        "(LOWER(path) LIKE LOWER(#) ESCAPE '\\' OR LOWER(delivered_to) LIKE LOWER(#) ESCAPE '\\')",
    batch: "batch_key IN (SELECT batch_key FROM batches WHERE name = #)",
    site: "SUBSTR(batch_key, 1, LENGTH(#) + 1) = # || '/'",
    role: |role| match role {
        Role::Edge => "batch_key NOT LIKE '%/%'",
        Role::Core => "batch_key LIKE '%/%'",
    },
    updated: "updated_at",
};

enum FilterValue {
    Text(String),
    Int(i64),
}

/// How far a file of a batch has come: its state, size and parts at the relay or further.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProgress {
    pub object_id: String,
    pub state: FileState,
    pub size: i64,
    pub parts_done: i64,
    /// The raw bytes per part it was cut into, if recorded (the last of a queue go smaller).
    pub part_size: Option<i64>,
}

pub(crate) type Query<'q> = sqlx::query::Query<'q, sqlx::Any, AnyArguments<'q>>;

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

/// `states` as an SQL list: each state is a word of the vocabulary, never the caller's text.
fn state_list(states: &[BatchState]) -> String {
    let list: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
    list.join(", ")
}

impl Catalog {
    /// Runs a read after every queued write is committed, and maps each row.
    fn read<T>(&self, query: Query<'_>, map: fn(&AnyRow) -> Result<T>) -> Result<Vec<T>> {
        self.flush()?;
        self.issued(&query);
        let rows = self.runtime.block_on(query.fetch_all(&self.pool))?;
        rows.iter().map(map).collect()
    }

    /// Notes the SQL of a read, for the plan test.
    pub(crate) fn issued(&self, _query: &Query<'_>) {
        #[cfg(test)]
        self.issued
            .lock()
            .unwrap()
            .push(sqlx::Execute::sql(_query).to_string());
    }

    pub fn batches(&self) -> Result<Vec<BatchRow>> {
        let sql = format!("{BATCH_COLUMNS} ORDER BY created_at, batch_key");
        self.read(sqlx::query(&sql), batch_row)
    }

    /// The batches in one of `states` (by `batches_by_state`), oldest first.
    pub fn batches_in(&self, states: &[BatchState]) -> Result<Vec<BatchRow>> {
        let sql = format!(
            "{BATCH_COLUMNS} WHERE state IN ({}) ORDER BY created_at, batch_key",
            state_list(states)
        );
        self.read(sqlx::query(&sql), batch_row)
    }

    /// Whether any batch is in one of `states` (by `batches_by_state`: a look costs the same
    /// whatever the history).
    pub fn any_batch_in(&self, states: &[BatchState]) -> Result<bool> {
        let sql = format!(
            "SELECT 1 FROM batches WHERE state IN ({}) LIMIT 1",
            state_list(states)
        );
        Ok(!self.read(sqlx::query(&sql), |_| Ok(()))?.is_empty())
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

    /// Every try of the site's own tasks on a batch (all batches: `None`), in the order they
    /// started.
    pub fn task_runs(&self, key: Option<&BatchKey>) -> Result<Vec<TaskRunRow>> {
        let columns = "SELECT batch_key, task, object_id, try_number, queued_at, started_at, ended_at, outcome, detail FROM task_runs";
        let sql = match key {
            Some(_) => format!("{columns} WHERE batch_key = $1 ORDER BY started_at, id"),
            None => format!("{columns} ORDER BY started_at, id"),
        };
        let mut query = sqlx::query(&sql);
        if let Some(key) = key {
            query = query.bind(key.to_string());
        }
        self.read(query, |r| {
            Ok(TaskRunRow {
                batch_key: batch_key(r, 0)?,
                task: r.try_get(1)?,
                object_id: r.try_get(2)?,
                try_number: r.try_get(3)?,
                queued_at: r.try_get(4)?,
                started_at: r.try_get(5)?,
                ended_at: r.try_get(6)?,
                outcome: vocabulary(r, 7, TaskOutcome::parse)?,
                detail: r.try_get(8)?,
            })
        })
    }

    pub fn files(&self, key: &BatchKey) -> Result<Vec<FileRow>> {
        let sql = format!("{FILE_COLUMNS} WHERE batch_key = $1 ORDER BY path");
        self.read(sqlx::query(&sql).bind(key.to_string()), file_row)
    }

    /// The core's files delivered and not yet acknowledged, of batches recorded delivered, by
    /// batch: what a pull confirms at its start (through `files_delivered`, whatever the
    /// history).
    pub fn delivered_unacknowledged(&self) -> Result<Vec<FileRow>> {
        let sql = "SELECT f.object_id, f.batch_key, f.path, f.size, f.raw_sha256, f.delivered_to,
                   f.state, f.updated_at, f.carrier FROM files f
                   JOIN batches b ON b.batch_key = f.batch_key
                   WHERE f.state = 'delivered' AND b.role = 'core' AND b.state = 'delivered'
                   ORDER BY f.batch_key, f.path";
        self.read(sqlx::query(sql), file_row)
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

    /// The files that came to their batch late ([`FollowUpRow`]), of every batch, in the
    /// order they were first seen. Two scans of the events, whatever the number of batches.
    pub fn follow_ups(&self) -> Result<Vec<FollowUpRow>> {
        // The first `sent` of an edge batch, the first `delivered` of a core batch: their
        // keys differ (a core's is `site/id`), so one catalogue shared by both serves too.
        const LATE: &str = "WITH done AS (
                 SELECT batch_key, MIN(at) AS at FROM events
                 WHERE object_id IS NULL AND state IN ('sent', 'delivered')
                 GROUP BY batch_key),
             seen AS (
                 SELECT e.batch_key, e.object_id, MIN(e.at) AS first_at,
                        MIN(CASE WHEN e.state = 'delivered' THEN e.at END) AS delivered_at
                 FROM events e JOIN done d ON d.batch_key = e.batch_key
                 WHERE e.object_id IS NOT NULL
                 GROUP BY e.batch_key, e.object_id),
             late AS (
                 SELECT s.batch_key, s.object_id, d.at AS done_at, s.first_at, s.delivered_at
                 FROM seen s JOIN done d ON d.batch_key = s.batch_key
                 WHERE s.first_at > d.at)";
        let late = format!(
            "{LATE}
             SELECT l.batch_key, l.object_id, f.path, f.size, l.done_at, l.first_at, l.delivered_at
             FROM late l JOIN files f ON f.batch_key = l.batch_key AND f.object_id = l.object_id
             ORDER BY l.first_at, f.path"
        );
        let mut rows = self.read(sqlx::query(&late), |r| {
            Ok(FollowUpRow {
                batch_key: batch_key(r, 0)?,
                object_id: r.try_get(1)?,
                path: r.try_get(2)?,
                size: r.try_get(3)?,
                batch_done_at: r.try_get(4)?,
                first_at: r.try_get(5)?,
                delivered_at: r.try_get(6)?,
                before_late: None,
            })
        })?;
        if rows.is_empty() {
            return Ok(rows);
        }
        let before = format!(
            "{LATE},
             cut AS (SELECT batch_key, MIN(first_at) AS at FROM late GROUP BY batch_key)
             SELECT e.batch_key, MAX(e.at) FROM events e JOIN cut c ON c.batch_key = e.batch_key
             WHERE e.at < c.at GROUP BY e.batch_key"
        );
        let cuts = self.read(sqlx::query(&before), |r| {
            Ok((batch_key(r, 0)?, r.try_get::<Option<i64>, _>(1)?))
        })?;
        for row in &mut rows {
            row.before_late = cuts
                .iter()
                .find(|(key, _)| *key == row.batch_key)
                .and_then(|(_, at)| *at);
        }
        Ok(rows)
    }

    /// Parts of an object with their state and hashes.
    pub fn parts(&self, object_id: &str) -> Result<Vec<PartRow>> {
        let query = sqlx::query("SELECT idx, state, raw_sha256, ciphertext_sha256, part_size FROM parts WHERE object_id = $1 ORDER BY idx")
            .bind(object_id);
        self.read(query, |r| {
            Ok(PartRow {
                index: r.try_get(0)?,
                state: vocabulary(r, 1, PartState::parse)?,
                raw_sha256: r.try_get(2)?,
                ciphertext_sha256: r.try_get(3)?,
                part_size: r.try_get(4)?,
            })
        })
    }

    /// Failures, newest first: failed attempts of tasks, and files and batches recorded as
    /// failed or damaged with their error; of one batch, or of all.
    pub fn failures(&self, batch: Option<&BatchKey>, limit: i64) -> Result<Vec<Failure>> {
        let of_batch = if batch.is_some() {
            " AND batch_key = $2"
        } else {
            ""
        };
        let sql = format!(
            "SELECT at, task, batch_key, object_id, part, error FROM (
                 SELECT ended_at AS at, task, batch_key, object_id, part, error FROM attempts
                 WHERE outcome = 'failed'{of_batch}
                 UNION ALL
                 SELECT ended_at, 'task ' || task, batch_key, object_id, NULL, detail
                 FROM task_runs WHERE outcome <> 'passed'{of_batch}
                 UNION ALL
                 SELECT at, CASE WHEN object_id IS NULL THEN 'batch' ELSE 'file' END,
                        batch_key, object_id, part, detail FROM events
                 WHERE state IN ('failed', 'damaged', 'refused', 'quarantined')
                   AND detail IS NOT NULL{of_batch}
             ) failures ORDER BY at DESC LIMIT $1"
        );
        let mut query = sqlx::query(&sql).bind(limit);
        if let Some(batch) = batch {
            query = query.bind(batch.to_string());
        }
        self.read(query, |r| {
            Ok(Failure {
                at: r.try_get(0)?,
                task: r.try_get(1)?,
                batch_key: batch_key(r, 2)?,
                object_id: r.try_get(3)?,
                part: r.try_get(4)?,
                error: r.try_get::<Option<String>, _>(5)?.unwrap_or_default(),
            })
        })
    }

    /// The batches `filter` matches (its limit aside), counted by site, role and state.
    pub fn batch_counts(&self, filter: &Filter) -> Result<Vec<BatchCount>> {
        let mut sql = String::new();
        self.read(filter.counts(&mut sql), |r| {
            Ok(BatchCount {
                site: r.try_get(0)?,
                role: vocabulary(r, 1, Role::parse)?,
                state: vocabulary(r, 2, BatchState::parse)?,
                batches: r.try_get(3)?,
                files: r.try_get(4)?,
                bytes: r.try_get(5)?,
            })
        })
    }

    /// Batches the filter selects, newest change first.
    pub fn batches_matching(&self, filter: &Filter) -> Result<Vec<BatchRow>> {
        let mut sql = String::new();
        self.read(
            filter.query(BATCH_COLUMNS, &BATCH_FILTER, &mut sql),
            batch_row,
        )
    }

    /// Files the filter selects, newest change first.
    pub fn files_matching(&self, filter: &Filter) -> Result<Vec<FileRow>> {
        let mut sql = String::new();
        self.read(filter.query(FILE_COLUMNS, &FILE_FILTER, &mut sql), file_row)
    }

    /// Every row of the object `object_id` (the edge's and the core's in a shared catalogue).
    pub fn files_of_object(&self, object_id: &str) -> Result<Vec<FileRow>> {
        let sql = format!("{FILE_COLUMNS} WHERE object_id = $1 ORDER BY updated_at");
        self.read(sqlx::query(&sql).bind(object_id), file_row)
    }

    /// When anything of a batch last changed (the batch, a file or a part): its last event.
    pub fn last_event(&self, key: &BatchKey) -> Result<Option<i64>> {
        let query =
            sqlx::query("SELECT MAX(at) FROM events WHERE batch_key = $1").bind(key.to_string());
        let rows = self.read(query, |r| Ok(r.try_get::<Option<i64>, _>(0)?))?;
        Ok(rows.into_iter().next().flatten())
    }

    /// How far each file of a batch has come: its state, size and how many of its parts are
    /// at the relay or further (uploaded, sealed or verified).
    pub fn progress(&self, key: &BatchKey) -> Result<Vec<FileProgress>> {
        let query = sqlx::query(
            "SELECT f.state, f.size, (SELECT COUNT(*) FROM parts p WHERE p.object_id = f.object_id
                 AND p.state IN ('uploaded', 'sealed', 'verified')), f.object_id,
                 (SELECT MAX(p.part_size) FROM parts p WHERE p.object_id = f.object_id)
             FROM files f WHERE f.batch_key = $1",
        )
        .bind(key.to_string());
        self.read(query, |r| {
            Ok(FileProgress {
                state: vocabulary(r, 0, FileState::parse)?,
                size: r.try_get(1)?,
                parts_done: r.try_get(2)?,
                object_id: r.try_get(3)?,
                part_size: r.try_get(4)?,
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

    /// The tuning timeline of every send since `since` (µs; by `tuning_samples_by_at`),
    /// oldest first.
    pub fn tuning_samples(&self, since: i64) -> Result<Vec<TuningSample>> {
        let query = sqlx::query("SELECT node, at, uploads, level, goodput, reason FROM tuning_samples WHERE at >= $1 ORDER BY at, node").bind(since);
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

    /// Utilisation of one node (or of every node) since `since` (µs), oldest first: its 1-s
    /// samples of the last day, then the 1-min and 1-h rollups of older ones (each a row
    /// whose `seconds` is what it covers).
    pub fn usage_of(&self, node: Option<&str>, since: i64) -> Result<Vec<UsageRow>> {
        const COLUMNS: &str = "node, at, seconds, cpu_percent, memory_used, disk_read_bps, disk_write_bps, net_rx_bps, net_tx_bps, own_cpu_percent, own_memory, latency_items, latency_p50_ms, latency_p87_ms, latency_p99_ms";
        let of_node = if node.is_some() { " AND node = $2" } else { "" };
        let sql = format!(
            "SELECT {COLUMNS} FROM usage WHERE at >= $1{of_node}
             UNION ALL SELECT {COLUMNS} FROM usage_rollups WHERE at >= $1{of_node}
             ORDER BY at"
        );
        let mut query = sqlx::query(&sql).bind(since);
        if let Some(node) = node {
            query = query.bind(node);
        }
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
                item_latency: ItemLatency {
                    items: r.try_get(11)?,
                    p50_ms: r.try_get(12)?,
                    p87_ms: r.try_get(13)?,
                    p99_ms: r.try_get(14)?,
                },
            })
        })
    }
}
