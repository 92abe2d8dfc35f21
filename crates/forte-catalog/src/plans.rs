//! Every read the catalogue serves, planned by the database: none may scan a table that grows
//! with history (a year of it is millions of rows), unless it is one of the reads listed in
//! [`KNOWN`], each with why it still does. The reads are issued through the public API, as
//! the views, commands and daemons issue them, and each one's SQL is explained as issued.
//! What a plan cannot show: a search on a key most rows share reads them all the same
//! (`edge_seals`, the edge's seal view, is one; it reads three columns of each). On
//! PostgreSQL a condition on a later column of an index is an "Index Cond" although the whole
//! index is read: its check finds the reads no index serves at all; SQLite's is the stricter.

use std::collections::BTreeSet;

use sqlx::Row;

use crate::vocabulary::{BatchKey, BatchState, FileState, Task};
use crate::{Attempt, BatchRecord, Catalog, FileRecord, Filter, UsageRow};

/// Tables whose rows grow with history.
const GROWING: &[&str] = &[
    "batches",
    "files",
    "parts",
    "events",
    "attempts",
    "stages",
    "task_runs",
    "usage",
    "usage_rollups",
    "batch_instances",
    "tuning_samples",
];

/// Partial indexes: a scan of one reads only the rows it holds (the few not acknowledged, the
/// failures), not history.
const PARTIAL: &[&str] = &[
    "files_delivered",
    "attempts_failed",
    "task_runs_not_passed",
    "events_failures",
];

/// Reads that still scan a growing table (a piece of each one's SQL) and why: what is left of
/// issue 58's views, which take windows and limits next.
const KNOWN: &[(&str, &str)] = &[
    (
        "ORDER BY created_at, batch_key",
        "batches(): every batch, for views without a window yet",
    ),
    (
        "FROM task_runs ORDER BY",
        "task_runs(None): the report's, not windowed yet",
    ),
    (
        "receipt IS NOT NULL",
        "receipts(): `forte receipts` lists every receipt",
    ),
    (
        "LIMIT 9223372036854775807",
        "a filter without a limit reads every match: views pass one",
    ),
];

fn populated(catalog: &Catalog) -> BatchKey {
    let key = BatchKey::core("mine-7", "0123456789abcdef0123456789abcdef");
    for state in [BatchState::Pulling, BatchState::Failed] {
        let record = BatchRecord {
            key: &key,
            name: "run-1",
            files: 1,
            bytes: 10,
            state,
            arrived: None,
            detail: Some("why"),
        };
        catalog.batch_state(&record).unwrap();
    }
    for state in [FileState::Delivered, FileState::Failed] {
        let file = FileRecord {
            delivered_to: Some("mine-7/run-1/a"),
            ..FileRecord::new(&key, "00112233445566778899aabbccddeeff", "a", 10, state)
        };
        catalog.file_state(&file).unwrap();
    }
    let attempt = Attempt {
        task: Task::Download,
        batch: &key,
        object_id: None,
        part: None,
        started_at: 1,
        ended_at: 2,
        error: Some("failed"),
    };
    catalog.attempt(&attempt).unwrap();
    catalog
        .usage(UsageRow {
            node: "core@n".into(),
            at: 5,
            seconds: 1.0,
            ..UsageRow::default()
        })
        .unwrap();
    key
}

/// Issues every read, as its callers do.
fn read_everything(catalog: &Catalog, key: &BatchKey) {
    let object = "00112233445566778899aabbccddeeff";
    let filters = [
        Filter::default(),
        Filter {
            site: Some("mine-7".into()),
            limit: Some(20),
            ..Filter::default()
        },
        Filter {
            batch: Some("run-1".into()),
            ..Filter::default()
        },
        Filter {
            site: Some("mine-7".into()),
            since: Some(1),
            ..Filter::default()
        },
        Filter {
            state: Some("failed".into()),
            since: Some(1),
            limit: Some(20),
            ..Filter::default()
        },
    ];
    catalog.batches().unwrap();
    catalog.batch(key).unwrap();
    catalog.any_batch_in(&[BatchState::Pulling]).unwrap();
    // As the overview (the running states) and a pull's start (pulling, checking) read them.
    catalog
        .batches_in(&[BatchState::Pulling, BatchState::Checking])
        .unwrap();
    catalog.stages(key).unwrap();
    catalog.task_runs(Some(key)).unwrap();
    catalog.task_runs(None).unwrap();
    catalog.files(key).unwrap();
    catalog.delivered_unacknowledged().unwrap();
    catalog.files_at("mine-7/run-1/a").unwrap();
    catalog.lineage(object).unwrap();
    catalog.follow_ups().unwrap();
    catalog.parts(object).unwrap();
    catalog.failures(None, 10).unwrap();
    catalog.failures(Some(key), 1).unwrap();
    for filter in &filters {
        // The summary is always of a window or of one batch.
        if filter.since.is_some() || filter.batch.is_some() {
            catalog.batch_counts(filter).unwrap();
        }
        catalog.batches_matching(filter).unwrap();
        catalog.files_matching(filter).unwrap();
    }
    catalog.files_of_object(object).unwrap();
    catalog.last_event(key).unwrap();
    catalog.progress(key).unwrap();
    catalog.tuned("https://relay").unwrap();
    catalog.tuning_samples(4).unwrap();
    catalog.usage_of(None, 0).unwrap();
    catalog.usage_of(None, 4).unwrap();
    catalog.usage_of(Some("core@n"), 4).unwrap();
    catalog.edge_seals().unwrap();
    catalog.instances_of(key).unwrap();
    catalog.delivered_instance("mine-7", object).unwrap();
    catalog.receipts().unwrap();
    catalog
        .sequence_alerts(&mut crate::SequenceLog::default(), 0)
        .unwrap();
}

/// The tables (by name, aliases resolved) a SQLite plan scans without an index; a scan of an
/// index is fine where the query stops at a limit.
fn full_scans(catalog: &Catalog, sql: &str) -> Vec<String> {
    let params = (1..=20).filter(|n| sql.contains(&format!("${n}"))).count();
    let explain = format!("EXPLAIN QUERY PLAN {sql}");
    let mut query = sqlx::query(&explain);
    for _ in 0..params {
        query = query.bind(None::<String>);
    }
    let rows = catalog
        .runtime
        .block_on(query.fetch_all(&catalog.pool))
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let words: Vec<&str> = sql.split_whitespace().collect();
    let table_of = |name: &str| {
        // `FROM files f`, `JOIN batches b`: an alias stands for the table before it.
        words
            .windows(2)
            .find(|w| w[1] == name && GROWING.contains(&w[0]))
            .map_or(name.to_string(), |w| w[0].to_string())
    };
    // A filter without a limit asks for the largest one.
    let limited = sql.contains("LIMIT") && !sql.contains("LIMIT 9223372036854775807");
    rows.iter()
        .filter_map(|r| {
            let detail: String = r.try_get(3).ok()?;
            let rest = detail.strip_prefix("SCAN ")?;
            let name = rest.split_whitespace().next()?;
            let indexed = rest.contains("USING INDEX") || rest.contains("USING COVERING INDEX");
            let partial = PARTIAL
                .iter()
                .any(|i| rest.ends_with(&format!("INDEX {i}")));
            let table = table_of(name);
            (GROWING.contains(&table.as_str()) && !partial && !(indexed && limited))
                .then(|| format!("{detail} (table {table})"))
        })
        .collect()
}

/// The reads that scan a growing table in `catalog`'s plans (`scans_of` each SQL), but for
/// those [`KNOWN`]; and the known ones seen.
fn scanning_reads(
    catalog: &Catalog,
    scans_of: impl Fn(&str) -> Vec<String>,
) -> (Vec<String>, BTreeSet<&'static str>) {
    let key = populated(catalog);
    read_everything(catalog, &key);
    let issued: BTreeSet<String> = catalog.issued.lock().unwrap().iter().cloned().collect();
    assert!(issued.len() > 25, "{} reads issued", issued.len());
    let mut scanning = Vec::new();
    let mut known_seen = BTreeSet::new();
    for sql in &issued {
        let scans = scans_of(sql);
        if scans.is_empty() {
            continue;
        }
        match KNOWN.iter().find(|(piece, _)| sql.contains(piece)) {
            Some((piece, _)) => {
                known_seen.insert(*piece);
            }
            None => scanning.push(format!("{sql}\n    {}", scans.join("; "))),
        }
    }
    (scanning, known_seen)
}

#[test]
fn no_read_scans_a_table_that_grows_with_history() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::open(dir.path().join("p.sqlite").to_str().unwrap()).unwrap();
    let (scanning, known_seen) = scanning_reads(&catalog, |sql| full_scans(&catalog, sql));
    assert!(
        scanning.is_empty(),
        "reads that scan a table growing with history:\n{}",
        scanning.join("\n")
    );
    // A read fixed since is taken off the list.
    let stale: Vec<_> = KNOWN
        .iter()
        .filter(|(piece, _)| !known_seen.contains(piece))
        .collect();
    assert!(
        stale.is_empty(),
        "no longer scanning, off the list: {stale:?}"
    );
}

/// The same on PostgreSQL: each read's generic plan (as a prepared statement, whatever its
/// parameters), with sequential scans discouraged, so that one left is one no index serves.
#[test]
fn postgres_no_read_scans_a_table_that_grows_with_history() {
    let Some(url) = crate::tests::fresh_postgres() else {
        return;
    };
    let catalog = Catalog::open(&url).unwrap();
    let (scanning, _) = scanning_reads(&catalog, |sql| sequential_scans(&catalog, sql));
    assert!(
        scanning.is_empty(),
        "reads that scan a table growing with history:\n{}",
        scanning.join("\n")
    );
}

/// The growing tables a PostgreSQL generic plan of `sql` scans sequentially.
fn sequential_scans(catalog: &Catalog, sql: &str) -> Vec<String> {
    use sqlx::Executor;
    let params = (1..=20).filter(|n| sql.contains(&format!("${n}"))).count();
    let nulls = vec!["NULL"; params].join(", ");
    let execute = if params == 0 {
        "EXPLAIN EXECUTE q".to_string()
    } else {
        format!("EXPLAIN EXECUTE q({nulls})")
    };
    let plan: Vec<String> = catalog.runtime.block_on(async {
        let mut conn = catalog.pool.acquire().await.unwrap();
        for setting in [
            "SET plan_cache_mode = force_generic_plan",
            "SET enable_seqscan = off",
        ] {
            conn.execute(setting).await.unwrap();
        }
        conn.execute(format!("PREPARE q AS {sql}").as_str())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let rows = sqlx::query(&execute).fetch_all(&mut *conn).await.unwrap();
        conn.execute("DEALLOCATE q").await.unwrap();
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).unwrap())
            .collect()
    });
    // A node reads all its table when it is a sequential scan, or an index scan with no
    // index condition (unless the query stops at a limit, reading the index in order, or the
    // index is partial).
    let limited = sql.contains("LIMIT") && !sql.contains("LIMIT 9223372036854775807");
    let mut found = Vec::new();
    for (i, line) in plan.iter().enumerate() {
        let node = line.trim_start().trim_start_matches("->").trim();
        let Some((kind, rest)) = node.split_once(" on ") else {
            continue;
        };
        if !kind.contains("Scan") {
            continue;
        }
        let table = rest.split_whitespace().next().unwrap_or("");
        if !GROWING.contains(&table) {
            continue;
        }
        let details = plan[i + 1..]
            .iter()
            .take_while(|l| !l.contains("->"))
            .any(|l| l.contains("Index Cond"));
        let partial = PARTIAL.iter().any(|p| kind.contains(&format!("using {p}")));
        let whole = kind.starts_with("Seq Scan")
            || (kind.contains("Index")
                && !kind.starts_with("Bitmap")
                && !details
                && !limited
                && !partial);
        if whole {
            found.push(node.to_string());
        }
    }
    found
}
