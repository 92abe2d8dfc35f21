//! Leases on batches: several core workers (`forte pull --watch` on different machines) share
//! one relay and one catalogue, and each batch is delivered by the one worker that holds its
//! lease.
//!
//! The pattern of the PostgreSQL job queues (River, graphile-worker, Oban): a claim is one short
//! statement that takes a batch whose lease is free or expired (on PostgreSQL with
//! `FOR UPDATE SKIP LOCKED`, so a worker never waits behind another's claim), the holder renews
//! the lease while it works, and every claim raises the batch's attempt number, which is the
//! fencing token: a renewal or completion names its attempt, and one that was overtaken by a
//! newer claim changes nothing. A worker that is slow rather than dead is not stopped by this
//! alone: it learns it lost the batch at its next renewal or check, which is why the core checks
//! the lease before each step that others can see, and why placing a verified file is
//! idempotent.
//!
//! Lease times are the database's clock, never a worker's, so workers on machines whose
//! clocks differ agree on when a lease ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sqlx::{AnyPool, Row};

use crate::vocabulary::BatchKey;
use crate::Catalog;

/// The catalogue's leases, usable from any thread (a heartbeat's too). Claims, renewals and
/// releases go to the database at once, not through the writer's queue: a worker must know
/// whether it holds a batch before it acts.
#[derive(Clone)]
pub struct Leases {
    pub(crate) runtime: Arc<tokio::runtime::Runtime>,
    pub(crate) pool: AnyPool,
    pub(crate) url: String,
    postgres: bool,
    /// This process, `HOST:PID`, recorded with each lease it takes.
    process: String,
}

/// This worker's hold on a batch: valid while the catalogue's row still names its attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub batch: BatchKey,
    pub worker: String,
    /// The fencing token: raised by every claim of the batch.
    pub attempt: i64,
}

/// Who holds a batch now, as the catalogue says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub worker: String,
    pub attempt: i64,
    /// Whether that lease is still running (by the database's clock).
    pub live: bool,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The batch is this worker's until the lease ends or another claim overtakes it.
    Held(Lease),
    /// Another worker holds a live lease on it.
    Busy(Holder),
}

impl Catalog {
    /// The leases of core workers on batches, in this catalogue.
    pub fn leases(&self) -> Leases {
        Leases {
            runtime: self.runtime.clone(),
            pool: self.pool.clone(),
            url: self.url.clone(),
            postgres: crate::is_postgres(&self.url),
            process: this_process(),
        }
    }
}

/// `HOST:PID` of this process.
fn this_process() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = match host.trim() {
        "" => "localhost",
        name => name,
    };
    format!("{host}:{}", std::process::id())
}

impl Leases {
    /// The database's clock, in microseconds since the Unix epoch, as SQL.
    pub(crate) fn now_sql(&self) -> &'static str {
        if self.postgres {
            "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)"
        } else {
            "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
        }
    }

    /// Claims `batch` for `worker` for `lease`: granted when nobody holds a live lease on it,
    /// when `worker` itself held it (a restarted worker of the same name), or when the holder
    /// is exactly `overtake` (worker and attempt), a holder known to be gone. Each grant raises
    /// the batch's attempt.
    pub fn claim(
        &self,
        batch: &BatchKey,
        worker: &str,
        lease: Duration,
        overtake: Option<&Holder>,
    ) -> Result<Claim> {
        let key = batch.to_string();
        let now = self.now_sql();
        // Only the row, if it is free, is locked; one being claimed by another worker right now
        // is skipped rather than waited for (PostgreSQL; SQLite has one writer at a time).
        let skip_locked = if self.postgres {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        let take = format!(
            "UPDATE batch_claims SET worker = $2, attempt = attempt + 1, lease_until = {now} + $3, claimed_at = {now}, process = $6
             WHERE batch_key = (SELECT batch_key FROM batch_claims WHERE batch_key = $1
                 AND (lease_until < {now} OR worker = $2 OR (worker = $4 AND attempt = $5)){skip_locked})
             RETURNING attempt"
        );
        let (gone_worker, gone_attempt) = overtake.map_or(("", -1), |h| (&*h.worker, h.attempt));
        let attempt = self
            .runtime
            .block_on(async {
                sqlx::query(
                    "INSERT INTO batch_claims (batch_key, worker, attempt, lease_until, claimed_at)
                     VALUES ($1, '', 0, 0, 0) ON CONFLICT (batch_key) DO NOTHING",
                )
                .bind(&key)
                .execute(&self.pool)
                .await?;
                sqlx::query(&take)
                    .bind(&key)
                    .bind(worker)
                    .bind(micros(lease))
                    .bind(gone_worker)
                    .bind(gone_attempt)
                    .bind(&self.process)
                    .fetch_optional(&self.pool)
                    .await?
                    .map(|row| row.try_get::<i64, _>(0))
                    .transpose()
            })
            .with_context(|| format!("cannot claim batch {batch} in the catalogue {}", self.url))?;
        match attempt {
            Some(attempt) => Ok(Claim::Held(Lease {
                batch: batch.clone(),
                worker: worker.to_string(),
                attempt,
            })),
            None => Ok(Claim::Busy(self.holder(batch)?.unwrap_or(Holder {
                // Skipped while another worker's claim of it was being committed.
                worker: String::new(),
                attempt: 0,
                live: true,
            }))),
        }
    }

    /// Extends `lease` by `duration` from now. False when it was overtaken: another worker
    /// claimed the batch since (after this lease ran out), and this one must leave it.
    pub fn renew(&self, lease: &Lease, duration: Duration) -> Result<bool> {
        let sql = format!(
            "UPDATE batch_claims SET lease_until = {now} + $4
             WHERE batch_key = $1 AND worker = $2 AND attempt = $3",
            now = self.now_sql()
        );
        self.fenced(lease, &sql, Some(micros(duration)))
            .with_context(|| format!("cannot renew the lease on batch {}", lease.batch))
    }

    /// Ends `lease` now, so another worker may take the batch at once (after a failure, or once
    /// it is delivered and acknowledged). False when it had been overtaken already.
    pub fn release(&self, lease: &Lease) -> Result<bool> {
        let sql = "UPDATE batch_claims SET lease_until = 0
                   WHERE batch_key = $1 AND worker = $2 AND attempt = $3";
        self.fenced(lease, sql, None)
            .with_context(|| format!("cannot release the lease on batch {}", lease.batch))
    }

    /// Runs `sql` (parameters: batch key, worker, attempt, then `number` if given) and says
    /// whether it changed the row, i.e. whether `lease` is still the batch's newest claim.
    fn fenced(&self, lease: &Lease, sql: &str, number: Option<i64>) -> Result<bool> {
        let query = sqlx::query(sql)
            .bind(lease.batch.to_string())
            .bind(&lease.worker)
            .bind(lease.attempt);
        let query = match number {
            Some(n) => query.bind(n),
            None => query,
        };
        let done = self.runtime.block_on(query.execute(&self.pool))?;
        Ok(done.rows_affected() == 1)
    }

    /// These leases as another process would take them (tests of workers on other machines).
    pub fn as_process(self, process: &str) -> Self {
        Self {
            process: process.to_string(),
            ..self
        }
    }

    /// The processes (`HOST:PID`) other than this one holding a live lease under `worker`.
    pub fn live_processes_of(&self, worker: &str) -> Result<Vec<String>> {
        let sql = format!(
            "SELECT DISTINCT process FROM batch_claims
             WHERE worker = $1 AND lease_until >= {now} AND process IS NOT NULL AND process <> $2",
            now = self.now_sql()
        );
        let rows = self
            .runtime
            .block_on(
                sqlx::query(&sql)
                    .bind(worker)
                    .bind(&self.process)
                    .fetch_all(&self.pool),
            )
            .with_context(|| format!("cannot read the leases of worker {worker}"))?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).map_err(Into::into))
            .collect()
    }

    /// Who holds `batch`, if it was ever claimed.
    pub fn holder(&self, batch: &BatchKey) -> Result<Option<Holder>> {
        let sql = format!(
            "SELECT worker, attempt, CASE WHEN lease_until >= {now} THEN 1 ELSE 0 END
             FROM batch_claims WHERE batch_key = $1",
            now = self.now_sql()
        );
        let row = self
            .runtime
            .block_on(
                sqlx::query(&sql)
                    .bind(batch.to_string())
                    .fetch_optional(&self.pool),
            )
            .with_context(|| format!("cannot read the claim on batch {batch}"))?;
        row.map(|r| {
            Ok(Holder {
                worker: r.try_get(0)?,
                attempt: r.try_get(1)?,
                live: r.try_get::<i64, _>(2)? == 1,
            })
        })
        .transpose()
    }
}

/// Renews a lease in the background while its holder works, every third of its length.
/// Dropping it stops the renewals (it does not release the lease).
pub struct Heartbeat {
    lost: Arc<AtomicBool>,
    stop: Option<Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    /// Starts renewing `lease` for `duration` at a time.
    pub fn start(leases: Leases, lease: Lease, duration: Duration) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let flag = lost.clone();
        let thread = std::thread::Builder::new()
            .name("forte-lease".into())
            .spawn(move || {
                let mut renewed = Instant::now();
                loop {
                    match stopped.recv_timeout(duration / 3) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    match leases.renew(&lease, duration) {
                        Ok(true) => renewed = Instant::now(),
                        // Overtaken: another worker holds the batch now.
                        Ok(false) => break,
                        // The database is away: the lease may have run out meanwhile, and
                        // then another worker may hold the batch.
                        Err(_) if renewed.elapsed() >= duration => break,
                        Err(_) => {}
                    }
                }
                flag.store(true, Ordering::SeqCst);
            })
            .expect("starting a lease heartbeat");
        Self {
            lost,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Whether the lease was overtaken, or could not be renewed before it ran out.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    fn held(claim: Claim) -> Lease {
        match claim {
            Claim::Held(lease) => lease,
            Claim::Busy(h) => panic!("expected the claim to be granted, held by {h:?}"),
        }
    }

    /// The same checks run on SQLite and on PostgreSQL.
    pub fn exercise_claims(catalog: &Leases) {
        let batch = BatchKey::core("site-a", "b1");
        let first = held(catalog.claim(&batch, "w1", LEASE, None).unwrap());
        assert_eq!(first.attempt, 1);
        // A live lease keeps the batch from the others.
        match catalog.claim(&batch, "w2", LEASE, None).unwrap() {
            Claim::Busy(h) => {
                assert_eq!((h.worker.as_str(), h.attempt, h.live), ("w1", 1, true));
            }
            Claim::Held(l) => panic!("claimed twice: {l:?}"),
        }
        assert!(catalog.renew(&first, LEASE).unwrap());
        // An expired lease is taken over, with a new attempt that fences the old holder out.
        assert!(catalog.renew(&first, Duration::ZERO).unwrap());
        std::thread::sleep(Duration::from_millis(20));
        let second = held(catalog.claim(&batch, "w2", LEASE, None).unwrap());
        assert_eq!(second.attempt, 2);
        assert!(
            !catalog.renew(&first, LEASE).unwrap(),
            "the old holder renewed"
        );
        assert!(!catalog.release(&first).unwrap(), "the old holder released");
        // A holder known to be gone is overtaken at once, naming its exact attempt.
        let gone = catalog.holder(&batch).unwrap().unwrap();
        let stale = Holder {
            attempt: 1,
            ..gone.clone()
        };
        assert!(matches!(
            catalog.claim(&batch, "w3", LEASE, Some(&stale)).unwrap(),
            Claim::Busy(_)
        ));
        let third = held(catalog.claim(&batch, "w3", LEASE, Some(&gone)).unwrap());
        assert_eq!(third.attempt, 3);
        // Released, it is free for anyone at once.
        assert!(catalog.release(&third).unwrap());
        let fourth = held(catalog.claim(&batch, "w1", LEASE, None).unwrap());
        assert_eq!(fourth.attempt, 4);
        // Other batches are independent.
        let other = BatchKey::core("site-a", "b2");
        assert_eq!(
            held(catalog.claim(&other, "w2", LEASE, None).unwrap()).attempt,
            1
        );
    }

    /// Workers claiming the same batches at once: each batch goes to exactly one of them.
    pub fn race_claims(url: &str) {
        let batches: Vec<BatchKey> = (0..20)
            .map(|i| BatchKey::core("site-a", format!("race-{i}")))
            .collect();
        let won: Vec<Vec<BatchKey>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|w| {
                    let batches = &batches;
                    s.spawn(move || {
                        let catalog = Catalog::open(url).unwrap().leases();
                        batches
                            .iter()
                            .filter(|b| {
                                matches!(
                                    catalog.claim(b, &format!("w{w}"), LEASE, None).unwrap(),
                                    Claim::Held(_)
                                )
                            })
                            .cloned()
                            .collect()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let mut all: Vec<String> = won.iter().flatten().map(|b| b.to_string()).collect();
        all.sort();
        let mut expected: Vec<String> = batches.iter().map(|b| b.to_string()).collect();
        expected.sort();
        assert_eq!(all, expected, "every batch claimed exactly once");
    }

    #[test]
    fn a_heartbeat_keeps_a_lease_and_says_when_it_was_overtaken() {
        let dir = tempfile::tempdir().unwrap();
        let leases = Catalog::open(dir.path().join("c.sqlite").to_str().unwrap())
            .unwrap()
            .leases();
        let batch = BatchKey::core("site-a", "hb");
        let short = Duration::from_millis(300);
        let lease = held(leases.claim(&batch, "w1", short, None).unwrap());
        let heartbeat = Heartbeat::start(leases.clone(), lease.clone(), short);
        std::thread::sleep(Duration::from_secs(1));
        assert!(!heartbeat.lost());
        assert!(
            matches!(
                leases.claim(&batch, "w2", short, None).unwrap(),
                Claim::Busy(_)
            ),
            "a lease kept by its heartbeat was taken"
        );
        drop(heartbeat);
        std::thread::sleep(short + Duration::from_millis(50));
        let second = held(leases.claim(&batch, "w2", LEASE, None).unwrap());
        // The first holder's heartbeat, restarted, learns at its next renewal.
        let late = Heartbeat::start(leases.clone(), lease, short);
        std::thread::sleep(Duration::from_millis(250));
        assert!(late.lost(), "an overtaken lease was not reported lost");
        assert!(leases.renew(&second, LEASE).unwrap());
    }

    #[test]
    fn claims_fence_out_a_holder_whose_lease_was_taken_over_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("c.sqlite");
        let url = url.to_str().unwrap();
        exercise_claims(&Catalog::open(url).unwrap().leases());
        race_claims(url);
    }

    #[test]
    fn claims_fence_out_a_holder_whose_lease_was_taken_over_on_postgres() {
        let Some(url) = crate::tests::fresh_postgres() else {
            return;
        };
        exercise_claims(&Catalog::open(&url).unwrap().leases());
        race_claims(&url);
    }
}
