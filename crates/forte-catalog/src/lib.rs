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

//!
//! The modules: `vocabulary` (roles, states, stages, tasks, batch keys as types), `schema`
//! (the migrations), `recording` (what callers record, queued), `writer_thread` (the thread
//! that commits it, and the statements each record is written with), `reads` (rows back),
//! `claims` (core workers' leases on batches, read and written at once, not through the
//! writer thread), `custody` (batch instances and receipts), `etas` (the running batches'
//! ETAs as the node running each published them: the one estimate every view shows).

mod claims;
mod custody;
mod etas;
#[cfg(test)]
mod plans;
mod reads;
mod recording;
mod schema;
mod vocabulary;
mod writer_thread;

use std::path::Path;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Executor};

pub use claims::{Claim, Heartbeat, Holder, Lease, Leases};
pub use custody::{
    Earlier, EdgeSeal, EpochStart, Fenced, Gap, History, InstanceRow, SequenceAlerts, SequenceLog,
};
pub use etas::PublishedEta;
pub use reads::{
    BatchCount, BatchRow, Event, Failure, FileProgress, FileRow, Filter, FollowUpRow, ItemLatency,
    PartRow, StageRow, TaskRunRow, TunedRow, TuningSample, UsageRow,
};
pub use recording::{Attempt, BatchRecord, FileRecord, PartHashes, TaskRun, UsageRecorder};
pub use vocabulary::{BatchKey, BatchState, FileState, PartState, Role, Stage, Task, TaskOutcome};

use writer_thread::{Msg, Record};

/// Microseconds since the Unix epoch: the catalogue's clock.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// A catalogue time (microseconds since the Unix epoch) as `YYYY-MM-DD HH:MM:SS.mmm UTC`.
pub fn format_utc(micros: i64) -> String {
    let time = chrono::DateTime::from_timestamp_micros(micros.max(0)).unwrap_or_default();
    time.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string()
}

pub(crate) fn new_id() -> String {
    let mut b = [0u8; 12];
    getrandom::getrandom(&mut b).expect("the operating system's random source");
    hex::encode(b)
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
    /// A private copy read instead of the catalogue (`open_read_only` of a SQLite file with a
    /// write-ahead log), removed with the handle.
    snapshot: Option<std::path::PathBuf>,
    /// Every read's SQL, for the test that checks each one's plan (`plans`).
    #[cfg(test)]
    issued: std::sync::Mutex<Vec<String>>,
}

impl Drop for Catalog {
    fn drop(&mut self) {
        if let Some((queue, thread)) = self.writer.take() {
            drop(queue);
            let _ = thread.join();
        }
        if let Some(dir) = self.snapshot.take() {
            self.runtime.block_on(self.pool.close());
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The one-thread runtime a catalogue's queries run on.
fn catalogue_runtime() -> Result<Arc<tokio::runtime::Runtime>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the catalogue's runtime")?;
    Ok(Arc::new(runtime))
}

impl Catalog {
    /// Opens the catalogue at `url`: `postgres://…`, `sqlite://PATH`, or a plain file path for
    /// SQLite (the file is created, its directory must exist: a mistyped one is an error, not a
    /// new empty catalogue). Applies pending migrations. A catalogue that cannot be used (not
    /// a database, read-only, unreachable, wrong credentials) fails within [`OPEN_WITHIN`],
    /// with one line that names it and says what to do.
    pub fn open(url: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let url = if url.contains("://") {
            url.to_string()
        } else {
            let path = Path::new(url);
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                if !dir.is_dir() {
                    anyhow::bail!(
                        "cannot open the catalogue {}: its directory {} does not exist; create it, or give --catalog another path",
                        path.display(),
                        dir.display()
                    );
                }
            }
            format!("sqlite://{}?mode=rwc", path.display())
        };
        let runtime = catalogue_runtime()?;
        let shown = redact(&url);
        if let Some(path) = sqlite_file(&url) {
            writable(&path, &shown)?;
        }
        runtime.block_on(probe(&url, &shown))?;
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
            snapshot: None,
            #[cfg(test)]
            issued: Default::default(),
        };
        catalog.migrate()?;
        let (queue, inbox) = std::sync::mpsc::sync_channel(writer_thread::QUEUE_CAPACITY);
        let (runtime, pool) = (catalog.runtime.clone(), catalog.pool.clone());
        let url = catalog.url.clone();
        let thread = std::thread::Builder::new()
            .name("forte-catalog".into())
            .spawn(move || writer_thread::run(runtime, pool, url, inbox))
            .context("starting the catalogue writer")?;
        catalog.writer = Some((queue, thread));
        Ok(catalog)
    }

    /// Opens the catalogue at `url` to read it and never write (a dry run): `None` if a SQLite
    /// file is not there (nothing was recorded in it). PostgreSQL: read-only transactions. A
    /// SQLite file is opened `mode=ro` and `immutable=1`, so SQLite creates, locks and
    /// touches nothing beside it (no `-wal`, no `-shm`); but an immutable file is read
    /// without its write-ahead log, and forte's writers leave theirs behind (records not yet
    /// checkpointed into the file), so when a `-wal` is there the file and its log are
    /// copied into a private directory and the copy is read ([`snapshot`]). No migration, no
    /// writer thread.
    pub fn open_read_only(url: &str) -> Result<Option<Self>> {
        sqlx::any::install_default_drivers();
        let shown = redact(url);
        let file = sqlite_path(url);
        let mut snapshot = None;
        let url = match file {
            None => url.to_string(),
            Some(path) if !path.exists() => return Ok(None),
            Some(path)
                if with_suffix(&path, "-wal")
                    .metadata()
                    .is_ok_and(|m| m.len() > 0) =>
            {
                let copy = snapshot_of(&path)?;
                // The copy is this handle's own: SQLite replays the log into it.
                let url = format!("sqlite://{}?mode=rw", copy.join("catalog.sqlite").display());
                snapshot = Some(copy);
                url
            }
            Some(path) => format!("sqlite://{}?mode=ro&immutable=1", path.display()),
        };
        let runtime = catalogue_runtime()?;
        let pool = runtime
            .block_on(
                AnyPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(OPEN_WITHIN)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            if conn.backend_name() != "SQLite" {
                                conn.execute("SET default_transaction_read_only = on")
                                    .await?;
                            }
                            Ok(())
                        })
                    })
                    .connect(&url),
            )
            .map_err(|e| anyhow::anyhow!("cannot open the catalogue {shown}: {}", explain(&e)));
        let pool = pool.inspect_err(|_| {
            snapshot
                .iter()
                .for_each(|d| drop(std::fs::remove_dir_all(d)));
        })?;
        Ok(Some(Self {
            runtime,
            pool,
            url: shown,
            writer: None,
            last_at: Default::default(),
            snapshot,
            #[cfg(test)]
            issued: Default::default(),
        }))
    }

    /// Another handle on the same database, for reads only (a dashboard beside a daemon): it
    /// shares this one's connections, and its reads do not wait for this one's queued writes.
    pub fn reader(&self) -> Self {
        Self {
            runtime: self.runtime.clone(),
            pool: self.pool.clone(),
            url: self.url.clone(),
            writer: None,
            last_at: Default::default(),
            snapshot: None,
            #[cfg(test)]
            issued: Default::default(),
        }
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
                match schema::apply_migrations(&mut conn).await {
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
    pub(crate) fn tick(&self) -> i64 {
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

    pub(crate) fn submit(&self, record: Record) -> Result<()> {
        let (queue, _) = self.writer.as_ref().context("the catalogue is closed")?;
        queue
            .send(Msg::Record(record))
            .ok()
            .context("the catalogue writer stopped")
    }

    /// Waits until every record submitted so far is committed; reads call it first, so they
    /// see this process's own writes.
    pub fn flush(&self) -> Result<()> {
        // A reader ([`Catalog::reader`]) has no writer: nothing of its own to wait for.
        let Some((queue, _)) = self.writer.as_ref() else {
            return Ok(());
        };
        let (done, wait) = std::sync::mpsc::channel();
        queue
            .send(Msg::Flush(done))
            .ok()
            .context("the catalogue writer stopped")?;
        wait.recv().ok().context("the catalogue writer stopped")
    }
}

/// Whether the catalogue at `url` is PostgreSQL (else SQLite): the few statements the two
/// speak differently (lease times, row locks, how a writer's transaction begins) ask this.
pub(crate) fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres")
}

/// A URL with any password replaced, safe to print.
/// How long opening a catalogue may take before it is refused.
pub const OPEN_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// One connection to the catalogue, and one statement that needs to write (SQLite) or a
/// round trip (PostgreSQL), within [`OPEN_WITHIN`]: what makes the pool's connections fail is
/// said once, plainly, before the pool retries it for seconds.
async fn probe(url: &str, shown: &str) -> Result<()> {
    use sqlx::Connection;
    let tried = tokio::time::timeout(OPEN_WITHIN, async {
        let mut conn = sqlx::AnyConnection::connect(url).await?;
        if conn.backend_name() == "SQLite" {
            // A fresh file that several daemons open at once: switching it to WAL needs the
            // file alone, and SQLite answers "database is locked" at once rather than wait
            // (CI saw it: fresh_catalogues_opened_together_are_migrated_once). Tried again
            // until it goes or the timeout above ends it.
            while let Err(e) = conn.execute("PRAGMA journal_mode = WAL").await {
                if !explain(&e).contains("database is locked") {
                    return Err(e);
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        } else {
            conn.execute("SELECT 1").await?;
        }
        conn.close().await
    })
    .await;
    match tried {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(anyhow::anyhow!("cannot open the catalogue {shown}: {}", explain(&e))),
        Err(_) => Err(anyhow::anyhow!(
            "cannot open the catalogue {shown}: no answer within {} s; check that the server is up and reachable, or give --catalog another catalogue",
            OPEN_WITHIN.as_secs()
        )),
    }
}

/// The database file of a SQLite catalogue's `url`.
/// The file of a SQLite catalogue given as `--catalog` takes it: a plain path or a
/// `sqlite://` URL; none for a server (`postgres://`).
pub fn sqlite_path(url: &str) -> Option<std::path::PathBuf> {
    sqlite_file(url).or_else(|| (!url.contains("://")).then(|| url.into()))
}

fn sqlite_file(url: &str) -> Option<std::path::PathBuf> {
    let rest = url.strip_prefix("sqlite://")?;
    let path = rest.split_once('?').map_or(rest, |(path, _)| path);
    Some(Path::new(path).to_path_buf())
}

/// `path` with `suffix` appended to its name (`-wal`, `-shm`).
fn with_suffix(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// Copies the SQLite catalogue at `path` and its write-ahead log into a new private directory
/// (mode 0700 under the temporary directory), as `catalog.sqlite` and `catalog.sqlite-wal`,
/// and returns the directory. Only reads the originals. The log is copied first, and the
/// copy is taken again (up to five times) if either file changed meanwhile (a writer
/// committing or checkpointing), so that the copy is one state of the catalogue.
fn snapshot_of(path: &Path) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("forte-catalogue-{}", new_id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot make a directory for a copy of {}", path.display()))?;
    let wal = with_suffix(path, "-wal");
    let stamp = |p: &Path| p.metadata().ok().map(|m| (m.len(), m.modified().ok()));
    for _ in 0..5 {
        let before = (stamp(path), stamp(&wal));
        let copied = std::fs::copy(&wal, dir.join("catalog.sqlite-wal"))
            .and_then(|_| std::fs::copy(path, dir.join("catalog.sqlite")));
        if let Err(e) = copied {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e).with_context(|| format!("cannot read the catalogue {}", path.display()));
        }
        if (stamp(path), stamp(&wal)) == before {
            return Ok(dir);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    anyhow::bail!(
        "the catalogue {} changed at every one of 5 reads (a busy writer): try again",
        path.display()
    )
}

/// Refuses a SQLite catalogue whose file (or its WAL or shared-memory file) exists but cannot
/// be opened for writing: immutable (`chattr +i`), read-only to this user, or on a read-only
/// file system. SQLite would open it read-only and answer reads, and the first write, after
/// work was done, would fail; opening for writing (nothing written) tells now, and needs no
/// lock, so it does not wait for another daemon's writes.
fn writable(path: &Path, shown: &str) -> Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        match std::fs::OpenOptions::new().write(true).open(&file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => anyhow::bail!(
                "cannot open the catalogue {shown}: {} cannot be written ({e}); forte writes its catalogue: make it writable (chattr -i, chmod u+w, a file system mounted read-write), or give --catalog another file",
                Path::new(&file).display()
            ),
            _ => {}
        }
    }
    Ok(())
}

/// What a failed connection means, and what to do about it.
fn explain(e: &sqlx::Error) -> String {
    let text = e.to_string();
    let code = e
        .as_database_error()
        .and_then(|d| d.code().map(|c| c.into_owned()));
    match code.as_deref() {
        Some("28P01") | Some("28000") => {
            return format!("the server refused the user or password ({text}); fix them in the URL")
        }
        Some("3D000") => return format!("{text}; create the database, or fix its name in the URL"),
        _ => {}
    }
    if text.contains("file is not a database") {
        format!("it is not a SQLite database ({text}); give --catalog a new file, or move that one away")
    } else if text.contains("readonly") || text.contains("read-only") {
        format!("it is read-only ({text}); forte writes its catalogue: fix its permissions, or give --catalog another file")
    } else if text.contains("unable to open database file") {
        format!("{text}: the file cannot be created or opened there; check the path and its permissions")
    } else if matches!(e, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused)
    {
        format!("nothing answers there ({text}); start the database server, or fix the host and port in the URL")
    } else {
        text
    }
}

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
    use sqlx::AnyConnection;

    use super::*;

    /// The same checks run on SQLite and on PostgreSQL.
    pub fn exercise(catalog: &Catalog) {
        let b1 = BatchKey::edge("b1");
        let batch = |state| BatchRecord {
            key: &b1,
            name: "run-1",
            files: 2,
            bytes: 300,
            state,
            arrived: None,
            detail: None,
        };
        catalog.batch_state(&batch(BatchState::Queued)).unwrap();
        let a_bag = FileRecord::new(&b1, "o1", "bags/a.bag", 200, FileState::Discovered);
        catalog.file_state(&a_bag).unwrap();
        catalog
            .part_state(
                &b1,
                "o1",
                0,
                PartState::Uploaded,
                &PartHashes {
                    raw_sha256: Some("r0"),
                    ciphertext_sha256: Some("c0"),
                    ciphertext_length: Some(90),
                    part_size: Some(1 << 20),
                },
            )
            .unwrap();
        catalog
            .file_state(&FileRecord {
                state: FileState::Sealed,
                raw_sha256: Some("whole"),
                ..a_bag.clone()
            })
            .unwrap();
        catalog
            .file_state(&FileRecord {
                state: FileState::Delivered,
                delivered_to: Some("site-a/run-1/bags/a.bag"),
                detail: Some("ok"),
                ..a_bag.clone()
            })
            .unwrap();
        catalog.batch_state(&batch(BatchState::Sent)).unwrap();
        catalog
            .attempt(&Attempt {
                task: Task::Upload,
                batch: &b1,
                object_id: Some("o1"),
                part: Some(0),
                started_at: 1,
                ended_at: 2,
                error: Some("connection reset"),
            })
            .unwrap();
        catalog.stage(&b1, Stage::Send, 10, None).unwrap();
        catalog.stage(&b1, Stage::Send, 10, Some(20)).unwrap();
        assert_eq!(
            catalog.stages(&b1).unwrap(),
            [StageRow {
                stage: Stage::Send,
                started_at: 10,
                ended_at: Some(20)
            }]
        );

        let batches = catalog.batches().unwrap();
        assert_eq!(
            (batches.len(), batches[0].state, batches[0].files),
            (1, BatchState::Sent, 2)
        );
        assert_eq!(
            (batches[0].role, batches[0].batch_key.clone()),
            (Role::Edge, b1.clone())
        );
        let files = catalog.files(&b1).unwrap();
        assert_eq!(files[0].state, FileState::Delivered);
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
        let states = [
            FileState::Discovered.as_str(),
            PartState::Uploaded.as_str(),
            FileState::Sealed.as_str(),
            FileState::Delivered.as_str(),
        ];
        assert_eq!(lineage, states);
        let part = &catalog.parts("o1").unwrap()[0];
        assert_eq!(part.ciphertext_sha256.as_deref(), Some("c0"));
        assert_eq!(
            part.part_size,
            Some(1 << 20),
            "the size it was cut at, kept"
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
            own_cpu_percent: 1.0,
            own_memory: 1 << 20,
            item_latency: ItemLatency {
                items: 215,
                p50_ms: 55.2,
                p87_ms: 202.1,
                p99_ms: 312.0,
            },
        };
        catalog.usage(row.clone()).unwrap();
        assert_eq!(
            catalog.usage_of(Some("edge@test"), 0).unwrap(),
            std::slice::from_ref(&row)
        );
        assert_eq!(catalog.usage_of(None, 0).unwrap(), [row]);
        assert!(catalog.usage_of(None, 6).unwrap().is_empty(), "windowed");
        // The tuning history keeps one setting per relay, cluster and hour: the newest.
        let tuned = |uploads, at| TunedRow {
            relay: "https://relay:8443".into(),
            cluster: "small".into(),
            hour: 14,
            uploads,
            goodput: 60e6,
            at,
        };
        catalog.record_tuned(tuned(24, 1)).unwrap();
        catalog.record_tuned(tuned(32, 2)).unwrap();
        let kept = catalog.tuned("https://relay:8443").unwrap();
        assert_eq!(kept, [tuned(32, 2)]);
        assert!(catalog.tuned("https://other:8443").unwrap().is_empty());
        let sample = TuningSample {
            node: "edge@test".into(),
            at: 7,
            uploads: 24,
            level: 3,
            goodput: 50e6,
            reason: Some("probing".into()),
        };
        catalog.record_tuning_sample(sample.clone()).unwrap();
        assert_eq!(catalog.tuning_samples(0).unwrap(), [sample]);
        let failed = &catalog.failures(None, 5).unwrap()[0];
        assert_eq!(
            (failed.task.as_str(), failed.error.as_str()),
            ("upload", "connection reset")
        );
    }

    /// The reads the dashboard and API make: filters, progress, failures of a batch.
    pub fn exercise_views(catalog: &Catalog) {
        let odd = BatchKey::edge("odd");
        let core = BatchKey::core("site-a", "odd");
        for (key, state) in [(&odd, BatchState::Sending), (&core, BatchState::Pulling)] {
            let record = BatchRecord {
                key,
                name: "50%_done",
                files: 1,
                bytes: 3 << 20,
                state,
                arrived: None,
                detail: None,
            };
            catalog.batch_state(&record).unwrap();
        }
        let big = FileRecord::new(&odd, "big", "x/big.bin", 3 << 20, FileState::Discovered);
        catalog.file_state(&big).unwrap();
        for index in 0..2 {
            let uploaded = PartState::Uploaded;
            catalog
                .part_state(&odd, "big", index, uploaded, &Default::default())
                .unwrap();
        }
        let progress = catalog.progress(&odd).unwrap();
        assert_eq!(progress.len(), 1);
        assert_eq!((progress[0].size, progress[0].parts_done), (3 << 20, 2));
        // Names match literally: `%` and `_` are themselves, not wildcards.
        let named = |name: &str| Filter {
            name: Some(name.into()),
            ..Filter::default()
        };
        assert_eq!(catalog.batches_matching(&named("50%_d")).unwrap().len(), 2);
        assert!(catalog.batches_matching(&named("5_%")).unwrap().is_empty());
        // Whatever the case, on both back ends (PostgreSQL's LIKE alone would heed it).
        assert_eq!(
            catalog.batches_matching(&named("50%_DONE")).unwrap().len(),
            2
        );
        assert_eq!(catalog.files_matching(&named("BIG.Bin")).unwrap().len(), 1);
        let core_only = Filter {
            role: Some(Role::Core),
            state: Some("pulling".into()),
            ..named("done")
        };
        let found = catalog.batches_matching(&core_only).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].batch_key, core);
        let latest = Filter {
            limit: Some(1),
            ..Filter::default()
        };
        assert_eq!(
            catalog.batches_matching(&latest).unwrap()[0].batch_key,
            core
        );
        let files = catalog.files_matching(&named("big.bin")).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(catalog.files_of_object("big").unwrap()[0].path, "x/big.bin");
        // A failed batch's error is its failure, and the last event says when it last moved.
        let failed = BatchRecord {
            key: &odd,
            name: "50%_done",
            files: 1,
            bytes: 3 << 20,
            state: BatchState::Failed,
            arrived: None,
            detail: Some("the relay refused it"),
        };
        catalog.batch_state(&failed).unwrap();
        let failures = catalog.failures(Some(&odd), 10).unwrap();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(
            (failures[0].task.as_str(), failures[0].error.as_str()),
            ("batch", "the relay refused it")
        );
        assert_eq!(catalog.last_event(&odd).unwrap(), Some(failures[0].at));
        assert!(catalog.failures(Some(&core), 10).unwrap().is_empty());
        // A site, exactly, and a whole-name glob: another site's batch of the same name is not
        // theirs, and a name that only contains the pattern does not match it.
        let other = BatchKey::core("site-a2", "odd2");
        let record = BatchRecord {
            key: &other,
            name: "50%_done",
            files: 1,
            bytes: 1,
            state: BatchState::Delivered,
            arrived: None,
            detail: None,
        };
        catalog.batch_state(&record).unwrap();
        let of_site = |site: &str, pattern: &str| Filter {
            site: Some(site.into()),
            pattern: Some(pattern.into()),
            ..Filter::default()
        };
        let found = catalog.batches_matching(&of_site("site-a", "50*")).unwrap();
        assert_eq!(
            found.iter().map(|b| &b.batch_key).collect::<Vec<_>>(),
            [&core]
        );
        assert!(catalog
            .batches_matching(&of_site("site-a", "50"))
            .unwrap()
            .is_empty());
        assert!(catalog
            .batches_matching(&of_site("SITE-A", "50*"))
            .unwrap()
            .is_empty());
        assert_eq!(
            catalog
                .batches_matching(&of_site("site-a2", "5?%_D*"))
                .unwrap()
                .len(),
            1
        );
        let other_file = FileRecord::new(&other, "o2", "x/big.bin", 1, FileState::Delivered);
        catalog.file_state(&other_file).unwrap();
        let files_of = |site: &str| Filter {
            site: Some(site.into()),
            ..Filter::default()
        };
        assert!(catalog
            .files_matching(&files_of("site-a"))
            .unwrap()
            .is_empty());
        assert_eq!(
            catalog.files_matching(&files_of("site-a2")).unwrap()[0].object_id,
            "o2"
        );
    }

    #[test]
    fn sqlite_catalogue_records_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        // A directory that does not exist is refused, not made: a typo is not a new catalogue.
        let nested = dir.path().join("nested/catalog.sqlite");
        let refused = Catalog::open(nested.to_str().unwrap()).err().unwrap();
        assert!(refused.to_string().contains("does not exist"), "{refused}");
        assert!(!dir.path().join("nested").exists());
        let path = dir.path().join("catalog.sqlite");
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
                .batch_state(&BatchRecord {
                    key: &BatchKey::edge(format!("b{i}")),
                    name: "n",
                    files: 1,
                    bytes: 1,
                    state: BatchState::Queued,
                    arrived: None,
                    detail: None,
                })
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
    fn sqlite_catalogue_serves_the_dashboards_reads() {
        let dir = tempfile::tempdir().unwrap();
        exercise_views(&Catalog::open(dir.path().join("c.sqlite").to_str().unwrap()).unwrap());
    }

    #[test]
    fn postgres_catalogue_serves_the_dashboards_reads() {
        let Some(url) = fresh_postgres() else { return };
        exercise_views(&Catalog::open(&url).unwrap());
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

    fn file(catalog: &Catalog, batch: &BatchKey, id: &str, size: u64, state: FileState) {
        let path = format!("{id}.bag");
        catalog
            .file_state(&FileRecord::new(batch, id, &path, size, state))
            .unwrap();
    }

    fn batch(catalog: &Catalog, key: &BatchKey, files: u64, bytes: u64, state: BatchState) {
        let record = BatchRecord {
            key,
            name: "run-1",
            files,
            bytes,
            state,
            arrived: None,
            detail: None,
        };
        catalog.batch_state(&record).unwrap();
    }

    #[test]
    fn catalogue_times_read_as_utc_to_the_millisecond() {
        assert_eq!(
            format_utc(1_795_305_600_123_456),
            "2026-11-22 00:00:00.123 UTC"
        );
        assert_eq!(format_utc(-5), "1970-01-01 00:00:00.000 UTC");
    }

    /// The core knows a batch by its id until it opens its manifests: a later record that
    /// names it only by its id (a pull that ends as a replay of the same batch) keeps the name
    /// learned before.
    #[test]
    fn a_batch_named_before_keeps_its_name_when_recorded_by_its_id() {
        let (_dir, catalog) = one_shot();
        let key = BatchKey::core("site-a", "5bd2b8447dc5eb118330901b33b80091");
        let record = |name, state| BatchRecord {
            key: &key,
            name,
            files: 1,
            bytes: 10,
            state,
            arrived: None,
            detail: None,
        };
        catalog
            .batch_state(&record("batch-00001", BatchState::Quarantined))
            .unwrap();
        catalog
            .batch_state(&record(
                "5bd2b8447dc5eb118330901b33b80091",
                BatchState::Pulling,
            ))
            .unwrap();
        catalog.flush().unwrap();
        let row = catalog.batch(&key).unwrap().unwrap();
        assert_eq!(
            (row.name.as_str(), row.state),
            ("batch-00001", BatchState::Quarantined)
        );
    }

    /// A re-run that discovers again a file the core acknowledged, or fails on it, does not
    /// move it backwards, in its row or its lineage; a failure before delivery is recorded,
    /// and a retry's states follow it.
    #[test]
    fn a_file_state_only_moves_forward() {
        use FileState::*;
        let (_dir, catalog) = one_shot();
        let b = BatchKey::edge("b");
        for state in [Discovered, Sealed, Delivered, Acknowledged] {
            file(&catalog, &b, "o1", 10, state);
        }
        for state in [Discovered, AtRelay, Sealed, Failed, Delivered] {
            file(&catalog, &b, "o1", 10, state);
        }
        assert_eq!(catalog.files(&b).unwrap()[0].state, Acknowledged);
        let lineage: Vec<_> = catalog
            .lineage("o1")
            .unwrap()
            .into_iter()
            .map(|e| e.state)
            .collect();
        let forward = [Discovered, Sealed, Delivered, Acknowledged].map(FileState::as_str);
        assert_eq!(lineage, forward);

        for state in [Discovered, Failed, Discovered, Sealed] {
            file(&catalog, &b, "o2", 10, state);
        }
        let states: Vec<_> = catalog
            .lineage("o2")
            .unwrap()
            .into_iter()
            .map(|e| e.state)
            .collect();
        let retried = [Discovered, Failed, Discovered, Sealed].map(FileState::as_str);
        assert_eq!(states, retried);
        assert_eq!(catalog.files(&b).unwrap()[1].state, Sealed);
    }

    /// A batch's totals come from its files and are never lowered by a run that saw (or sent)
    /// only part of it: a re-run that sent nothing does not make it 0 B, a pull that listed 59
    /// of its 150 objects does not make it 59 files.
    #[test]
    fn batch_totals_come_from_its_files_and_never_shrink() {
        use BatchState::*;
        let (_dir, catalog) = one_shot();
        let e = BatchKey::edge("e");
        batch(&catalog, &e, 5, 500, Queued);
        for i in 0..5 {
            file(&catalog, &e, &format!("o{i}"), 100, FileState::Discovered);
        }
        batch(&catalog, &e, 5, 0, Sent);
        // A late file sent as a follow-up, by a run that sees only it.
        file(&catalog, &e, "late", 50, FileState::Discovered);
        batch(&catalog, &e, 1, 50, Sent);
        let b = catalog.batch(&e).unwrap().unwrap();
        assert_eq!((b.state, b.files, b.bytes), (Sent, 6, 550));

        let c = BatchKey::core("site", "c");
        batch(&catalog, &c, 150, 9000, Pulling);
        batch(&catalog, &c, 59, 3000, Pulling);
        for i in 0..59 {
            file(&catalog, &c, &format!("o{i}"), 100, FileState::Delivered);
        }
        batch(&catalog, &c, 59, 3000, Delivered);
        let b = catalog.batch(&c).unwrap().unwrap();
        // The core's bytes are on the wire: its files' raw sizes do not replace them.
        assert_eq!((b.state, b.files, b.bytes), (Delivered, 150, 9000));
        assert_eq!((b.role, b.site.as_str()), (Role::Core, "site"));
    }

    /// A file that appears in a batch after its first send (edge) or first delivery (core)
    /// is read as a follow-up, with when the batch was done and what came last before it;
    /// the batch's own files are not.
    #[test]
    fn late_files_are_told_from_the_batchs_first_send_and_delivery() {
        use BatchState::{Queued, Sent};
        use FileState::{Acknowledged, Discovered, Sealed};
        let (_dir, catalog) = one_shot();
        let e = BatchKey::edge("e");
        let c = BatchKey::core("site", "e");
        batch(&catalog, &e, 2, 200, Queued);
        for id in ["o0", "o1"] {
            file(&catalog, &e, id, 100, Discovered);
            file(&catalog, &e, id, 100, Sealed);
        }
        batch(&catalog, &e, 2, 200, Sent);
        for id in ["o0", "o1"] {
            file(&catalog, &c, id, 100, FileState::Delivered);
        }
        batch(&catalog, &c, 2, 200, BatchState::Delivered);
        for id in ["o0", "o1"] {
            file(&catalog, &c, id, 100, Acknowledged);
        }
        // The follow-up: found after the send, delivered after the first delivery.
        file(&catalog, &e, "late", 10, Discovered);
        file(&catalog, &e, "late", 10, Sealed);
        batch(&catalog, &e, 1, 10, Sent);
        // At the core a late file's first record is its part's, verified.
        catalog
            .part_state(&c, "late", 0, PartState::Verified, &PartHashes::default())
            .unwrap();
        file(&catalog, &c, "late", 10, FileState::Delivered);
        batch(&catalog, &c, 1, 10, BatchState::Delivered);
        let at = |key: &BatchKey, id: Option<&str>, state: &str| {
            let events = match id {
                Some(id) => catalog.lineage(id).unwrap(),
                None => vec![],
            };
            events
                .into_iter()
                .find(|ev| ev.batch_key == *key && ev.state == state)
                .map(|ev| ev.at)
                .unwrap()
        };
        let rows = catalog.follow_ups().unwrap();
        assert_eq!(rows.len(), 2, "{rows:#?}");
        let edge = rows.iter().find(|r| r.batch_key == e).unwrap();
        let core = rows.iter().find(|r| r.batch_key == c).unwrap();
        assert_eq!(
            (edge.object_id.as_str(), edge.path.as_str(), edge.size),
            ("late", "late.bag", 10)
        );
        assert_eq!(edge.first_at, at(&e, Some("late"), "discovered"));
        assert!(edge.batch_done_at > at(&e, Some("o1"), "sealed"));
        assert!(edge.batch_done_at < edge.first_at);
        assert_eq!(edge.delivered_at, None);
        assert_eq!(core.delivered_at, Some(at(&c, Some("late"), "delivered")));
        assert_eq!(core.before_late, Some(at(&c, Some("o1"), "acknowledged")));
        assert!(core.first_at < core.delivered_at.unwrap(), "{core:?}");
        assert!(core.batch_done_at < at(&c, Some("o0"), "acknowledged"));
    }

    /// A batch's state moves forward for its role; a failure may be followed by a retry, but
    /// is not recorded over a batch delivered for good.
    #[test]
    fn a_batch_state_only_moves_forward() {
        use BatchState::*;
        let (_dir, catalog) = one_shot();
        let state = |key: &BatchKey, s: BatchState| {
            batch(&catalog, key, 1, 1, s);
            catalog.batch(key).unwrap().unwrap().state
        };
        let e = BatchKey::edge("e");
        assert_eq!(state(&e, Sent), Sent);
        let at = catalog.batch(&e).unwrap().unwrap().updated_at;
        assert_eq!(state(&e, Queued), Sent);
        assert_eq!(state(&e, Sending), Sent);
        assert_eq!(catalog.batch(&e).unwrap().unwrap().updated_at, at);
        assert_eq!(state(&e, Failed), Failed);
        assert_eq!(state(&e, Queued), Queued);
        assert_eq!(state(&e, Sent), Sent);
        assert_eq!(state(&e, SourceDeleted), SourceDeleted);
        assert_eq!(state(&e, Failed), SourceDeleted);

        // A file that appears in a batch whose other files were kept sends it again.
        let k = BatchKey::edge("k");
        assert_eq!(state(&k, Sent), Sent);
        assert_eq!(state(&k, SourceKept), SourceKept);
        assert_eq!(state(&k, Queued), Queued);

        let c = BatchKey::core("site", "c");
        assert_eq!(state(&c, Pulling), Pulling);
        assert_eq!(state(&c, Delivered), Delivered);
        assert_eq!(state(&c, Pulling), Delivered);
        assert_eq!(state(&c, Failed), Delivered);
    }

    /// A stage spans from its earliest start to its latest end: a re-run's start does not move
    /// it or reopen it.
    #[test]
    fn a_stage_keeps_its_first_start_and_is_not_reopened() {
        let (_dir, catalog) = one_shot();
        let b = BatchKey::edge("b");
        let span = || {
            let s = &catalog.stages(&b).unwrap()[0];
            (s.started_at, s.ended_at)
        };
        catalog.stage(&b, Stage::Send, 10, None).unwrap();
        catalog.stage(&b, Stage::Send, 15, None).unwrap(); // killed, then run again
        assert_eq!(span(), (10, None));
        catalog.stage(&b, Stage::Send, 15, Some(20)).unwrap();
        assert_eq!(span(), (10, Some(20)));
        catalog.stage(&b, Stage::Send, 30, None).unwrap();
        assert_eq!(span(), (10, Some(20)), "a later run does not reopen it");
        catalog.stage(&b, Stage::Send, 30, Some(40)).unwrap();
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

    /// Usage history stays bounded: 1-s samples for a day, 1-min rollups for 30 days, 1-h
    /// ones after; every second a sample covered is still covered by exactly one row.
    /// (Samples 10 minutes apart here, so that 40 days are quick to write.)
    #[test]
    fn usage_history_is_rolled_up_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        usage_is_rolled_up_in(
            &Catalog::open(dir.path().join("u.sqlite").to_str().unwrap()).unwrap(),
        );
    }

    #[test]
    fn postgres_usage_history_is_rolled_up_and_bounded() {
        let Some(url) = fresh_postgres() else {
            return;
        };
        usage_is_rolled_up_in(&Catalog::open(&url).unwrap());
    }

    fn usage_is_rolled_up_in(catalog: &Catalog) {
        use writer_thread::{MINUTES_KEPT_US, SECONDS_KEPT_US};
        let step = 600_000_000;
        let start = 1_700_000_000_000_000 - 1_700_000_000_000_000 % (3_600_000_000);
        let samples = 40 * 24 * 6;
        for i in 0..samples {
            catalog
                .usage(UsageRow {
                    node: "core@n".into(),
                    at: start + i * step,
                    seconds: 600.0,
                    cpu_percent: 10.0,
                    memory_used: 1 << 20,
                    ..UsageRow::default()
                })
                .unwrap();
        }
        let now = start + (samples - 1) * step;
        let rows = catalog.usage_of(None, 0).unwrap();
        let covered: f64 = rows.iter().map(|r| r.seconds).sum();
        assert_eq!(
            covered,
            samples as f64 * 600.0,
            "no second lost or counted twice"
        );
        let raw = rows
            .iter()
            .filter(|r| r.seconds == 600.0 && r.at % 60_000_000 == 0);
        assert!(rows.iter().all(|r| r.cpu_percent == 10.0));
        let oldest_raw = catalog
            .usage_of(None, now - SECONDS_KEPT_US - step)
            .unwrap();
        assert!(oldest_raw.len() < rows.len());
        // Of 5 760 samples: a day's (144) kept, then one row a minute-bucket for 29 days,
        // then one an hour.
        assert!(rows.len() < 144 + 30 * 144 + 11 * 24, "{}", rows.len());
        assert!(raw.count() > 0);
        let before_hours = rows
            .iter()
            .filter(|r| r.at < now - MINUTES_KEPT_US - 3_600_000_000);
        assert!(
            before_hours.clone().all(|r| r.at % 3_600_000_000 == 0),
            "older than 30 days: hours only"
        );
        assert!(before_hours.count() > 0);
    }
}
