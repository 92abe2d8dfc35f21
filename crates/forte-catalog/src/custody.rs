//! Batch instances and their custody receipts (table `batch_instances`, migration 10).
//!
//! At the edge, each instance of a batch it sealed: a fresh id and the site's next sequence
//! number for every new content, the same instance again when it seals the same content again
//! (after a refused seal, or a relay that lost it), and the core's receipt once verified. At the
//! core, each instance it delivered, with the receipt it signed: an instance offered again is a
//! replay, acknowledged with that receipt and never delivered again, and a sequence number
//! missing below ones that arrived is a gap to alert on.
//!
//! These go to the database at once, not through the writer's queue: whether an instance is a
//! replay, and which sequence number comes next, must be known before acting.

use anyhow::{Context, Result};
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::claims::{Lease, Leases};
use crate::vocabulary::{BatchKey, Role};
use crate::{now_us, Catalog};

/// What recording a delivered instance under a lease did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// Recorded: this worker's attempt held the batch when the row was written.
    Recorded,
    /// Another worker recorded the same instance first.
    AlreadyRecorded,
    /// This worker's attempt no longer holds the batch: nothing recorded.
    LeaseLost,
}

/// One batch instance as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRow {
    pub role: Role,
    pub site: String,
    /// 32 hex digits, as signed in the inventory.
    pub instance: String,
    pub sequence: i64,
    pub batch_key: BatchKey,
    /// A digest of what the instance holds (its inventory's objects), so the edge seals the
    /// same content as the same instance.
    pub content: String,
    /// At the core: the ids of the files it delivered (empty at the edge).
    pub objects: Vec<String>,
    /// When the edge sealed it, microseconds since the Unix epoch.
    pub sealed_at: i64,
    /// When this catalogue recorded it.
    pub recorded_at: i64,
    /// The core's signed receipt (JSON), once signed (core) or verified (edge).
    pub receipt: Option<String>,
    /// Its place in the batch's history, as its inventory signs it (empty before format 3).
    pub history: History,
}

/// An instance's place in its batch's history: the edge's sequence epoch, the instance's
/// generation within it and the earlier instances it supersedes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct History {
    /// 32 hex digits; empty for an instance sealed before format 3.
    pub epoch: String,
    /// The epoch's first sequence number.
    pub epoch_from: i64,
    /// 1 for a batch's first instance in the epoch; 0 before format 3.
    pub generation: i64,
    /// The earlier instances of the batch in the epoch, oldest first.
    pub supersedes: Vec<Earlier>,
}

/// An earlier instance of a batch, superseded by a later one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Earlier {
    pub instance: String,
    pub sequence: i64,
    pub content: String,
}

impl History {
    /// The superseded instances as stored: `INSTANCE:SEQUENCE:CONTENT`, space-separated.
    fn supersedes_text(&self) -> String {
        let one = |e: &Earlier| format!("{}:{}:{}", e.instance, e.sequence, e.content);
        self.supersedes
            .iter()
            .map(one)
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn parse_supersedes(text: &str) -> Result<Vec<Earlier>> {
        text.split_whitespace()
            .map(|one| {
                let mut fields = one.splitn(3, ':');
                let (Some(instance), Some(sequence), Some(content)) =
                    (fields.next(), fields.next(), fields.next())
                else {
                    anyhow::bail!("a superseded instance recorded as {one:?}");
                };
                Ok(Earlier {
                    instance: instance.to_string(),
                    sequence: sequence
                        .parse()
                        .with_context(|| format!("a superseded instance recorded as {one:?}"))?,
                    content: content.to_string(),
                })
            })
            .collect()
    }
}

/// A site's edge began a new sequence epoch after an earlier one (its catalogue was replaced,
/// or it is a new edge for the site): its numbers start again, from `from`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochStart {
    pub site: String,
    pub epoch: String,
    pub from: i64,
    /// The epoch before it, and the last number seen in it.
    pub after_epoch: String,
    pub after_last: i64,
    /// When the new epoch's first instance arrived.
    pub since: i64,
}

/// Sequence numbers of a site that have not arrived while a later one has: `first..=last`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    pub site: String,
    /// The edge's sequence epoch the numbers belong to (empty before format 3).
    pub epoch: String,
    pub first: i64,
    pub last: i64,
    /// The sequence number after it that arrived first, and when.
    pub after: i64,
    pub since: i64,
}

const COLUMNS: &str = "SELECT role, site, instance, sequence, batch_key, content, sealed_at, recorded_at, receipt, objects, epoch, epoch_from, generation, supersedes FROM batch_instances";

fn instance_row(r: &AnyRow) -> Result<InstanceRow> {
    let role: String = r.try_get(0)?;
    let key: String = r.try_get(4)?;
    Ok(InstanceRow {
        role: Role::parse(&role).with_context(|| format!("unknown role {role:?}"))?,
        site: r.try_get(1)?,
        instance: r.try_get(2)?,
        sequence: r.try_get(3)?,
        batch_key: BatchKey::parse(&key),
        content: r.try_get(5)?,
        sealed_at: r.try_get(6)?,
        recorded_at: r.try_get(7)?,
        receipt: r.try_get(8)?,
        objects: {
            let text: String = r.try_get(9)?;
            text.split_whitespace().map(str::to_string).collect()
        },
        history: History {
            epoch: r.try_get(10)?,
            epoch_from: r.try_get(11)?,
            generation: r.try_get(12)?,
            supersedes: History::parse_supersedes(&r.try_get::<String, _>(13)?)?,
        },
    })
}

impl Catalog {
    fn instances_where(
        &self,
        condition: &str,
        binds: &[&str],
        what: &str,
    ) -> Result<Vec<InstanceRow>> {
        let sql = format!("{COLUMNS} WHERE {condition} ORDER BY sequence, recorded_at");
        let mut query = sqlx::query(&sql);
        for b in binds {
            query = query.bind(b.to_string());
        }
        let rows = self.fetch_rows(query, what)?;
        rows.iter().map(instance_row).collect()
    }

    /// The edge's instance for sealing `batch` with `content` at `site`: the batch's latest
    /// instance if it holds that content, or a new one recorded now, with the site's next
    /// sequence number in this catalogue's epoch, the next generation of the batch, and the
    /// batch's earlier instances of the epoch as those it supersedes. `fresh` makes a new id
    /// (random, 32 hex digits), for the instance and, at the site's first seal, the epoch.
    pub fn edge_instance(
        &self,
        batch: &BatchKey,
        site: &str,
        content: &str,
        fresh: impl Fn() -> String,
    ) -> Result<InstanceRow> {
        let key = batch.to_string();
        let earlier = self.instances_where(
            "role = 'edge' AND batch_key = $1 AND site = $2",
            &[&key, site],
            "the batch's instances",
        )?;
        // Only the latest: content that comes back after another was sealed (a file changed
        // and changed back) is a new instance, newer than both.
        if let Some(latest) = earlier.last().filter(|r| r.content == content) {
            return Ok(latest.clone());
        }
        let (epoch, epoch_from) = self.sequence_epoch(site, &fresh)?;
        let supersedes: Vec<Earlier> = earlier
            .iter()
            .filter(|r| r.history.epoch == epoch)
            .map(|r| Earlier {
                instance: r.instance.clone(),
                sequence: r.sequence,
                content: r.content.clone(),
            })
            .collect();
        let history = History {
            epoch,
            epoch_from,
            generation: supersedes.len() as i64 + 1,
            supersedes,
        };
        let instance = fresh();
        let now = now_us();
        self.runtime
            .block_on(
                sqlx::query(
                    "INSERT INTO batch_instances (role, site, instance, sequence, batch_key, content, objects, sealed_at, recorded_at, epoch, epoch_from, generation, supersedes)
                     VALUES ('edge', $1, $2,
                         (SELECT COALESCE(MAX(sequence), 0) + 1 FROM batch_instances WHERE role = 'edge' AND site = $1),
                         $3, $4, '', $5, $5, $6, $7, $8, $9)",
                )
                .bind(site)
                .bind(&instance)
                .bind(&key)
                .bind(content)
                .bind(now)
                .bind(&history.epoch)
                .bind(history.epoch_from)
                .bind(history.generation)
                .bind(history.supersedes_text())
                .execute(&self.pool),
            )
            .with_context(|| {
                format!("cannot record batch {batch}'s instance in the catalogue {}", self.url)
            })?;
        let rows = self.instances_where(
            "role = 'edge' AND site = $1 AND instance = $2",
            &[site, &instance],
            "the batch's new instance",
        )?;
        rows.into_iter()
            .next()
            .with_context(|| format!("batch {batch}'s new instance was not recorded"))
    }

    /// This catalogue's sequence epoch for `site` and its first number: chosen at the first
    /// seal for the site (a fresh id from `fresh`, numbered on from what the catalogue holds).
    fn sequence_epoch(&self, site: &str, fresh: &dyn Fn() -> String) -> Result<(String, i64)> {
        let what = || {
            format!(
                "cannot record the sequence epoch of site {site} in the catalogue {}",
                self.url
            )
        };
        self.runtime
            .block_on(
                sqlx::query(
                    "INSERT INTO sequence_epochs (site, epoch, first_sequence, started_at)
                     VALUES ($1, $2,
                         (SELECT COALESCE(MAX(sequence), 0) + 1 FROM batch_instances WHERE role = 'edge' AND site = $1),
                         $3)
                     ON CONFLICT (site) DO NOTHING",
                )
                .bind(site)
                .bind(fresh())
                .bind(now_us())
                .execute(&self.pool),
            )
            .with_context(what)?;
        let row = self
            .runtime
            .block_on(
                sqlx::query("SELECT epoch, first_sequence FROM sequence_epochs WHERE site = $1")
                    .bind(site)
                    .fetch_one(&self.pool),
            )
            .with_context(what)?;
        Ok((row.try_get(0)?, row.try_get(1)?))
    }

    /// The rows of `query` (noted for the plan test), an error naming `what` it reads.
    fn fetch_rows(&self, query: crate::reads::Query<'_>, what: &str) -> Result<Vec<AnyRow>> {
        self.issued(&query);
        self.runtime
            .block_on(query.fetch_all(&self.pool))
            .with_context(|| format!("cannot read {what} from the catalogue {}", self.url))
    }

    /// Each batch the edge sealed: the site it was sealed for, and whether a receipt the edge
    /// verified covers it. Only that, not the receipts (the seal view asks on every look).
    pub fn edge_seals(&self) -> Result<Vec<EdgeSeal>> {
        let query = sqlx::query(
            "SELECT batch_key, site, receipt IS NOT NULL FROM batch_instances WHERE role = 'edge'",
        );
        let rows = self.fetch_rows(query, "the edge's seals")?;
        rows.iter()
            .map(|r| {
                Ok(EdgeSeal {
                    batch_key: r.try_get(0)?,
                    site: r.try_get(1)?,
                    receipted: r
                        .try_get::<bool, _>(2)
                        .or_else(|_| r.try_get::<i64, _>(2).map(|n| n != 0))?,
                })
            })
            .collect()
    }

    /// Every instance recorded for `batch` (at this catalogue's end), oldest sequence first.
    pub fn instances_of(&self, batch: &BatchKey) -> Result<Vec<InstanceRow>> {
        let role = batch.role().as_str();
        self.instances_where(
            "role = $1 AND batch_key = $2",
            &[role, &batch.to_string()],
            "the batch's instances",
        )
    }

    /// The instance `instance` of `site` as the core recorded it, if it delivered it.
    pub fn delivered_instance(&self, site: &str, instance: &str) -> Result<Option<InstanceRow>> {
        let rows = self.instances_where(
            "role = 'core' AND site = $1 AND instance = $2",
            &[site, instance],
            "delivered instances",
        )?;
        Ok(rows.into_iter().next())
    }

    /// Keeps the core's verified receipt with the edge's instance.
    pub fn keep_receipt(&self, site: &str, instance: &str, receipt: &str) -> Result<()> {
        self.runtime
            .block_on(
                sqlx::query(
                    "UPDATE batch_instances SET receipt = $3 WHERE role = 'edge' AND site = $1 AND instance = $2",
                )
                .bind(site)
                .bind(instance)
                .bind(receipt)
                .execute(&self.pool),
            )
            .with_context(|| format!("cannot keep a receipt in the catalogue {}", self.url))?;
        Ok(())
    }

    /// Every receipt this catalogue holds (signed at the core, or verified at the edge).
    pub fn receipts(&self) -> Result<Vec<InstanceRow>> {
        self.instances_where("receipt IS NOT NULL", &[], "receipts")
    }

    /// What the core's sequence numbers say: the gaps ([`sequence_gaps`], `older_than` as
    /// there) and each site's epochs after its first ([`epoch_starts`]). `log` keeps what
    /// earlier looks read: this one reads only the instances recorded since (by
    /// `batch_instances_by_time`), and only their numbers, not their receipts.
    pub fn sequence_alerts(
        &self,
        log: &mut SequenceLog,
        older_than: i64,
    ) -> Result<SequenceAlerts> {
        // Again a little before the last read's newest: another worker's row recorded
        // then, or by a clock a little behind, is read too (each instance is taken once).
        let from = log.newest.saturating_sub(SEQUENCE_OVERLAP_US);
        let query = sqlx::query(
            "SELECT site, instance, epoch, epoch_from, sequence, recorded_at, supersedes
             FROM batch_instances WHERE role = 'core' AND recorded_at >= $1",
        )
        .bind(from);
        let rows = self.fetch_rows(query, "delivered instances")?;
        for r in &rows {
            let (site, instance): (String, String) = (r.try_get(0)?, r.try_get(1)?);
            let recorded_at: i64 = r.try_get(5)?;
            log.newest = log.newest.max(recorded_at);
            if !log.seen.insert((site.clone(), instance)) {
                continue;
            }
            let superseded = History::parse_supersedes(&r.try_get::<String, _>(6)?)?;
            log.numbers.push(Numbered {
                site,
                epoch: r.try_get(2)?,
                epoch_from: r.try_get(3)?,
                sequence: r.try_get(4)?,
                recorded_at,
                superseded: superseded.iter().map(|e| e.sequence).collect(),
            });
        }
        Ok(SequenceAlerts {
            gaps: sequence_gaps(&log.numbers, older_than),
            starts: epoch_starts(&log.numbers),
        })
    }
}

/// One of the edge's seals, as the seal view needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeSeal {
    pub batch_key: String,
    pub site: String,
    /// A receipt the edge verified covers it.
    pub receipted: bool,
}

/// How far before the newest instance a look has read the next look reads again.
const SEQUENCE_OVERLAP_US: i64 = 60_000_000;

/// The numbers of the instances the core delivered, as the gap check has read them so far:
/// kept between its looks, so that each reads only what was recorded since.
#[derive(Debug, Default)]
pub struct SequenceLog {
    numbers: Vec<Numbered>,
    seen: std::collections::HashSet<(String, String)>,
    newest: i64,
}

/// One delivered instance as the gap check needs it.
#[derive(Debug)]
struct Numbered {
    site: String,
    epoch: String,
    epoch_from: i64,
    sequence: i64,
    recorded_at: i64,
    /// The numbers of the instances it supersedes.
    superseded: Vec<i64>,
}

/// The gaps and new epochs among a site's sequence numbers at the core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceAlerts {
    pub gaps: Vec<Gap>,
    pub starts: Vec<EpochStart>,
}

/// The runs of sequence numbers missing at the core below ones that arrived at least
/// `older_than` microseconds ago, per site and epoch, counted from the epoch's first number
/// (1 before format 3): a batch the relay dropped, or one still on its way (a core whose
/// catalogue is new sees every earlier number as one run). A number an instance that
/// arrived names as superseded was replaced, not dropped: it counts as arrived.
fn sequence_gaps(rows: &[Numbered], older_than: i64) -> Vec<Gap> {
    type Arrivals = (i64, Vec<(i64, i64)>);
    let mut by_epoch: std::collections::BTreeMap<(&str, &str), Arrivals> = Default::default();
    for r in rows {
        let (from, seen) = by_epoch
            .entry((&r.site, &r.epoch))
            .or_insert((r.epoch_from.max(1), Vec::new()));
        seen.push((r.sequence, r.recorded_at));
        seen.extend(r.superseded.iter().map(|&s| (s, r.recorded_at)));
        *from = (*from).min(r.epoch_from.max(1));
    }
    let now = now_us();
    let mut gaps = Vec::new();
    for ((site, epoch), (from, mut seen)) in by_epoch {
        seen.sort_unstable();
        seen.dedup_by_key(|s| s.0);
        let mut below = from - 1;
        for (high, arrived) in seen {
            if high > below + 1 && now - arrived >= older_than {
                gaps.push(Gap {
                    site: site.to_string(),
                    epoch: epoch.to_string(),
                    first: below + 1,
                    last: high - 1,
                    after: high,
                    since: arrived,
                });
            }
            below = below.max(high);
        }
    }
    gaps
}

/// Each sequence epoch of a site's edge after the site's first, in the order they arrived
/// at the core: an edge whose catalogue was replaced, which numbers from its new epoch's
/// first number again.
fn epoch_starts(rows: &[Numbered]) -> Vec<EpochStart> {
    // Per site, per epoch: when it first arrived, its first number and its last.
    let mut by_site: std::collections::BTreeMap<&str, Vec<(i64, &str, i64, i64)>> =
        Default::default();
    for r in rows {
        let epochs = by_site.entry(&r.site).or_default();
        match epochs.iter_mut().find(|e| e.1 == r.epoch) {
            Some(e) => {
                e.0 = e.0.min(r.recorded_at);
                e.3 = e.3.max(r.sequence);
            }
            None => epochs.push((r.recorded_at, &r.epoch, r.epoch_from, r.sequence)),
        }
    }
    let mut starts = Vec::new();
    for (site, mut epochs) in by_site {
        epochs.sort_unstable();
        for pair in epochs.windows(2) {
            let (before, (since, epoch, from, _)) = (pair[0], pair[1]);
            starts.push(EpochStart {
                site: site.to_string(),
                epoch: epoch.to_string(),
                from,
                after_epoch: before.1.to_string(),
                after_last: before.3,
                since,
            });
        }
    }
    starts
}

impl Leases {
    /// Records at the core that it delivered `row`, in the same statement that checks `lease`
    /// still holds its batch (worker and attempt, lease not run out by the database's clock):
    /// a worker that stalled past its lease records nothing, and so acknowledges nothing.
    pub fn record_delivered_instance(&self, lease: &Lease, row: &InstanceRow) -> Result<Fenced> {
        let sql = format!(
            "INSERT INTO batch_instances (role, site, instance, sequence, batch_key, content, sealed_at, recorded_at, receipt, objects, epoch, epoch_from, generation, supersedes)
             SELECT 'core', $1, $2, $3, $4, $5, $6, $7, $8, $12, $13, $14, $15, $16
             WHERE EXISTS (SELECT 1 FROM batch_claims WHERE batch_key = $9 AND worker = $10 AND attempt = $11 AND lease_until >= {now})
             ON CONFLICT (role, site, instance) DO NOTHING",
            now = self.now_sql()
        );
        let what = || {
            format!(
                "cannot record the delivery of instance {} of site {} in the catalogue {}",
                row.instance, row.site, self.url
            )
        };
        let done = self
            .runtime
            .block_on(
                sqlx::query(&sql)
                    .bind(&row.site)
                    .bind(&row.instance)
                    .bind(row.sequence)
                    .bind(row.batch_key.to_string())
                    .bind(&row.content)
                    .bind(row.sealed_at)
                    .bind(row.recorded_at)
                    .bind(row.receipt.as_deref())
                    .bind(lease.batch.to_string())
                    .bind(&lease.worker)
                    .bind(lease.attempt)
                    .bind(row.objects.join(" "))
                    .bind(&row.history.epoch)
                    .bind(row.history.epoch_from)
                    .bind(row.history.generation)
                    .bind(row.history.supersedes_text())
                    .execute(&self.pool),
            )
            .with_context(what)?;
        if done.rows_affected() == 1 {
            return Ok(Fenced::Recorded);
        }
        let recorded = self
            .runtime
            .block_on(
                sqlx::query(
                    "SELECT 1 FROM batch_instances WHERE role = 'core' AND site = $1 AND instance = $2",
                )
                .bind(&row.site)
                .bind(&row.instance)
                .fetch_optional(&self.pool),
            )
            .with_context(what)?;
        Ok(if recorded.is_some() {
            Fenced::AlreadyRecorded
        } else {
            Fenced::LeaseLost
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(catalog: &Catalog, site: &str, sequence: i64, recorded_at: i64) {
        let leases = catalog.leases();
        let batch = BatchKey::core(site, format!("b{sequence}"));
        let long = std::time::Duration::from_secs(60);
        let crate::Claim::Held(lease) = leases.claim(&batch, "w", long, None).unwrap() else {
            panic!("a free batch");
        };
        let row = InstanceRow {
            role: Role::Core,
            site: site.into(),
            instance: format!("{sequence:032x}"),
            sequence,
            batch_key: batch.clone(),
            content: String::new(),
            objects: Vec::new(),
            sealed_at: 0,
            recorded_at,
            receipt: Some("{}".into()),
            history: History::default(),
        };
        let record = || leases.record_delivered_instance(&lease, &row).unwrap();
        assert_eq!(record(), Fenced::Recorded);
        assert_eq!(record(), Fenced::AlreadyRecorded, "recorded once");
    }

    #[test]
    fn missing_sequence_numbers_are_runs_counted_from_1_once_a_later_one_is_old_enough() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("c.sqlite").to_str().unwrap()).unwrap();
        let old = now_us() - 60_000_000;
        for seq in [1, 2, 5, 6] {
            delivered(&catalog, "mine-7", seq, old);
        }
        delivered(&catalog, "mine-7", 9, now_us());
        delivered(&catalog, "ship-2", 3, old);
        let mut log = SequenceLog::default();
        let gaps = catalog.sequence_alerts(&mut log, 30_000_000).unwrap().gaps;
        let runs: Vec<(&str, i64, i64, i64)> = gaps
            .iter()
            .map(|g| (g.site.as_str(), g.first, g.last, g.after))
            .collect();
        // 7..8 is missing too, but 9 arrived just now: it may still be on its way.
        assert_eq!(runs, [("mine-7", 3, 4, 5), ("ship-2", 1, 2, 3)]);
        assert_eq!(catalog.sequence_alerts(&mut log, 0).unwrap().gaps.len(), 3);
        // Later looks read only what was recorded since (or a little before: another
        // worker's rows, by a clock a little behind), and keep what they read before.
        delivered(&catalog, "mine-7", 3, now_us() - 30_000_000);
        delivered(&catalog, "mine-7", 4, now_us() - 30_000_000);
        let gaps = catalog.sequence_alerts(&mut log, 0).unwrap().gaps;
        let runs: Vec<_> = gaps
            .iter()
            .map(|g| (g.site.as_str(), g.first, g.last))
            .collect();
        assert_eq!(runs, [("mine-7", 7, 8), ("ship-2", 1, 2)]);
        assert_eq!(log.numbers.len(), 8, "each instance once: {log:?}");
        let row = catalog
            .delivered_instance("mine-7", &format!("{:032x}", 5))
            .unwrap();
        assert_eq!(row.map(|r| r.sequence), Some(5));
        assert!(catalog
            .delivered_instance("ship-2", &format!("{:032x}", 5))
            .unwrap()
            .is_none());
    }

    /// A worker whose lease was overtaken records nothing; the holder records once; a second
    /// record of the same instance is known as such.
    #[test]
    fn an_instance_is_recorded_only_under_the_lease_that_holds_its_batch() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("f.sqlite").to_str().unwrap()).unwrap();
        let leases = catalog.leases();
        let batch = BatchKey::core("mine-7", "b1");
        let short = std::time::Duration::from_millis(1);
        let crate::Claim::Held(stale) = leases.claim(&batch, "w1", short, None).unwrap() else {
            panic!("free batch");
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        let long = std::time::Duration::from_secs(60);
        let crate::Claim::Held(holder) = leases.claim(&batch, "w2", long, None).unwrap() else {
            panic!("the stale lease ran out");
        };
        let row = InstanceRow {
            role: Role::Core,
            site: "mine-7".into(),
            instance: format!("{:032x}", 7),
            sequence: 1,
            batch_key: batch.clone(),
            content: String::new(),
            objects: vec!["0a".into(), "0b".into()],
            sealed_at: 0,
            recorded_at: now_us(),
            receipt: None,
            history: History::default(),
        };
        let fenced = |lease: &Lease| leases.record_delivered_instance(lease, &row).unwrap();
        assert_eq!(fenced(&stale), Fenced::LeaseLost);
        assert!(catalog
            .delivered_instance("mine-7", &row.instance)
            .unwrap()
            .is_none());
        assert_eq!(fenced(&holder), Fenced::Recorded);
        let kept = catalog.instances_of(&batch).unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].objects, ["0a", "0b"], "{kept:?}");
        assert_eq!(fenced(&holder), Fenced::AlreadyRecorded);
        assert_eq!(fenced(&stale), Fenced::AlreadyRecorded);
    }

    #[test]
    fn the_same_content_is_the_same_instance_and_new_content_takes_the_next_number() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("e.sqlite").to_str().unwrap()).unwrap();
        let (a, b) = (BatchKey::edge("a"), BatchKey::edge("b"));
        let fresh = |n: u8| move || format!("{n:032x}");
        let first = catalog.edge_instance(&a, "mine-7", "c1", fresh(1)).unwrap();
        let again = catalog.edge_instance(&a, "mine-7", "c1", fresh(2)).unwrap();
        assert_eq!(
            (first.sequence, again.instance.clone()),
            (1, first.instance.clone())
        );
        let follow_up = catalog.edge_instance(&a, "mine-7", "c2", fresh(3)).unwrap();
        let other = catalog.edge_instance(&b, "mine-7", "c1", fresh(4)).unwrap();
        let elsewhere = catalog.edge_instance(&b, "ship-2", "c1", fresh(5)).unwrap();
        assert_eq!(
            (follow_up.sequence, other.sequence, elsewhere.sequence),
            (2, 3, 1)
        );
        catalog
            .keep_receipt("mine-7", &first.instance, "{\"r\":1}")
            .unwrap();
        let kept: Vec<_> = catalog.receipts().unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].receipt.as_deref(), Some("{\"r\":1}"));
        assert_eq!(catalog.instances_of(&a).unwrap().len(), 2);
    }

    /// A new content of a batch is its next generation and supersedes the batch's earlier
    /// instances of the epoch; content that comes back after another is newer still; a
    /// catalogue's first seal for a site chooses its epoch, numbered on from what it holds.
    #[test]
    fn each_new_content_of_a_batch_is_its_next_generation_in_the_sites_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("h.sqlite").to_str().unwrap()).unwrap();
        let a = BatchKey::edge("a");
        let n = std::sync::atomic::AtomicU8::new(0);
        let fresh = || {
            let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            format!("{i:032x}")
        };
        let first = catalog.edge_instance(&a, "mine-7", "c1", fresh).unwrap();
        let second = catalog.edge_instance(&a, "mine-7", "c2", fresh).unwrap();
        let again = catalog.edge_instance(&a, "mine-7", "c2", fresh).unwrap();
        let back = catalog.edge_instance(&a, "mine-7", "c1", fresh).unwrap();
        assert_eq!(first.history.generation, 1);
        assert!(first.history.supersedes.is_empty());
        assert_eq!(first.history.epoch_from, 1);
        assert_eq!(
            again.instance, second.instance,
            "the same content, the same instance"
        );
        assert_eq!(second.history.generation, 2);
        assert_eq!(
            second.history.supersedes,
            [Earlier {
                instance: first.instance.clone(),
                sequence: 1,
                content: "c1".into()
            }]
        );
        assert_ne!(
            back.instance, first.instance,
            "newer than c2, so not c1's first instance"
        );
        assert_eq!((back.sequence, back.history.generation), (3, 3));
        let epochs: std::collections::HashSet<_> = [&first, &second, &back]
            .iter()
            .map(|r| r.history.epoch.clone())
            .collect();
        assert_eq!(epochs.len(), 1, "one epoch per catalogue and site");
        let other = catalog.edge_instance(&a, "ship-2", "c1", fresh).unwrap();
        assert_ne!(other.history.epoch, first.history.epoch);
    }

    /// Numbers an arrived instance supersedes are not gaps; each epoch counts from its own
    /// first number; an epoch after the first is a restart of the site's numbers.
    #[test]
    fn superseded_numbers_are_no_gap_and_a_new_epoch_is_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("g.sqlite").to_str().unwrap()).unwrap();
        let leases = catalog.leases();
        let old = now_us() - 60_000_000;
        let record = |sequence: i64, epoch: &str, from: i64, supersedes: &[i64], at: i64| {
            let batch = BatchKey::core("mine-7", format!("b{epoch}{sequence}"));
            let long = std::time::Duration::from_secs(60);
            let crate::Claim::Held(lease) = leases.claim(&batch, "w", long, None).unwrap() else {
                panic!("a free batch");
            };
            let supersedes = supersedes
                .iter()
                .map(|&sequence| Earlier {
                    instance: format!("{sequence:031x}f"),
                    sequence,
                    content: "c".into(),
                })
                .collect();
            let row = InstanceRow {
                role: Role::Core,
                site: "mine-7".into(),
                instance: format!("{epoch}{sequence:030x}"),
                sequence,
                batch_key: batch,
                content: String::new(),
                objects: Vec::new(),
                sealed_at: 0,
                recorded_at: at,
                receipt: None,
                history: History {
                    epoch: epoch.into(),
                    epoch_from: from,
                    generation: 1,
                    supersedes,
                },
            };
            assert_eq!(
                leases.record_delivered_instance(&lease, &row).unwrap(),
                Fenced::Recorded
            );
        };
        record(1, "e1", 1, &[], old);
        // 2 and 3 were superseded by 4 (the same batch, sealed again before it was pulled).
        record(4, "e1", 1, &[2, 3], old);
        record(6, "e1", 1, &[], old);
        // The edge's catalogue was replaced: a new epoch, from 1 again.
        record(1, "e2", 1, &[], old);
        record(3, "e2", 1, &[], old);
        let mut log = SequenceLog::default();
        let gaps: Vec<_> = catalog
            .sequence_alerts(&mut log, 30_000_000)
            .unwrap()
            .gaps
            .into_iter()
            .map(|g| (g.epoch, g.first, g.last))
            .collect();
        assert_eq!(gaps, [("e1".into(), 5, 5), ("e2".into(), 2, 2)]);
        let starts = catalog.sequence_alerts(&mut log, 0).unwrap().starts;
        assert_eq!(starts.len(), 1, "{starts:?}");
        assert_eq!(
            (
                starts[0].epoch.as_str(),
                starts[0].from,
                starts[0].after_epoch.as_str(),
                starts[0].after_last
            ),
            ("e2", 1, "e1", 6)
        );
    }
}
