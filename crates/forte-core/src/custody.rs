//! Custody at the core: a batch is filed only under the site its edge signed, and only if that
//! site's key signed it; an instance delivered before is a replay, acknowledged with the receipt
//! it got then and never delivered again; every delivered instance gets a receipt signed with
//! the core's key, kept in the catalogue before the relay is told; a site's sequence number
//! missing while later ones arrived is alerted on.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use forte_catalog::{format_utc, now_us, BatchKey, Fenced, Gap, History, InstanceRow, Role};
use forte_format::{Inventory, Outcome, Receipt, ReceiptFile, TrustedEdges};
use parking_lot::Mutex;

use super::kept_instances::KeptInstances;
use super::lease::{Held, LeaseLost};
use super::Core;

/// Where gap alerts name the destination and go.
pub struct GapAlerts {
    /// Where delivered batches are kept, as receipts name it (`--to`).
    pub destination: String,
    pub failures: forte_daemon::failures::Failures,
}

/// What the core needs for custody: whose keys may sign for which site, the key receipts are
/// signed with, and how long a sequence gap may stay open before it is alerted on.
pub struct CustodySettings<'a> {
    pub trusted: &'a forte_daemon::settings::TrustedKeys,
    pub receipt_key: Option<&'a forte_format::ReceiptKey>,
    pub gap_after: Duration,
    /// Where delivered batches are kept, as receipts name it (`--to`).
    pub destination: String,
    /// Where gap alerts go besides standard error.
    pub failures: forte_daemon::failures::Failures,
    /// Gaps alerted on already, each once.
    pub(super) alerted: Mutex<HashSet<Alerted>>,
    /// The delivered instances' numbers read so far: each look reads only the new ones.
    numbers: Mutex<forte_catalog::SequenceLog>,
    /// When the delivered instances may next be read for gaps: a watching puller looks after
    /// every delivery and every idle second, and reading every instance each time grows with
    /// the catalogue.
    pub(super) looks: Looks,
}

/// At most one look every so often: the first at once, the next `every` after it.
pub(super) struct Looks {
    every: Duration,
    next: Mutex<Option<Instant>>,
}

impl Looks {
    /// Looks for gaps alerted on after `gap_after`: every tenth of it, between one and ten
    /// seconds, so an alert comes at most a tenth late.
    fn for_gaps(gap_after: Duration) -> Self {
        Self {
            every: (gap_after / 10).clamp(Duration::from_secs(1), Duration::from_secs(10)),
            next: Mutex::default(),
        }
    }

    /// Whether a look is due at `now` (and then the next one is `every` later).
    fn due(&self, now: Instant) -> bool {
        let mut next = self.next.lock();
        if next.is_some_and(|next| now < next) {
            return false;
        }
        *next = Some(now + self.every);
        true
    }
}

impl<'a> CustodySettings<'a> {
    pub fn new(
        trusted: &'a forte_daemon::settings::TrustedKeys,
        receipt_key: Option<&'a forte_format::ReceiptKey>,
        gap_after: Duration,
        alerts: GapAlerts,
    ) -> Self {
        let GapAlerts {
            destination,
            failures,
        } = alerts;
        Self {
            trusted,
            receipt_key,
            gap_after,
            destination,
            failures,
            alerted: Mutex::default(),
            numbers: Mutex::default(),
            looks: Looks::for_gaps(gap_after),
        }
    }
}

/// The batch instance a signed inventory names.
#[derive(Debug, Clone)]
pub(super) struct Instance {
    pub site: String,
    /// The batch's name, as signed.
    pub batch: String,
    pub id: String,
    pub sequence: u64,
    pub sealed_at: i64,
    pub content: String,
    /// The ids of its files, as its inventory lists them.
    pub objects: Vec<String>,
    /// Its place in the batch's history, as signed.
    pub history: History,
}

impl Instance {
    /// Whether its edge signed it as a later version of its batch: then its files replace
    /// the earlier versions at the destination (each kept), since the core found no instance
    /// of the batch newer than it.
    pub fn supersedes_earlier(&self) -> bool {
        self.history.generation > 1
    }
}

/// A batch the core does not deliver although every byte verified: an instance it delivered
/// before, or one older than an instance of the same batch it delivered. Acknowledged with
/// the receipt of the instance it knows, not delivered, its tasks not run.
#[derive(Debug)]
pub(super) struct Replayed {
    /// The instance delivered before: this one again, or a newer one of its batch.
    pub known: InstanceRow,
    /// When this instance is older than `known` (and not `known` itself): its id and
    /// generation.
    pub superseded: Option<(String, u64)>,
}

impl Replayed {
    /// `known` offered again.
    fn again(known: InstanceRow) -> Self {
        Self {
            known,
            superseded: None,
        }
    }
}

impl std::fmt::Display for Replayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.known;
        let when = format_utc(r.recorded_at);
        match &self.superseded {
            None => write!(
                f,
                "replay: instance {} (sequence {}) of site {} was delivered at {when} as batch {}; acknowledged, not delivered again",
                r.instance, r.sequence, r.site, r.batch_key
            ),
            Some((instance, generation)) => write!(
                f,
                "superseded: instance {instance} (generation {generation}) of site {} is older than instance {} (generation {}, sequence {}) of the same batch, delivered at {when} as batch {}; acknowledged, not delivered (a stale version the relay offered, or one sealed before the newer was)",
                r.site, r.instance, r.history.generation, r.sequence, r.batch_key
            ),
        }
    }
}

/// Refuses, as a [`Replayed`], an instance delivered before (`earlier` holds it), or one
/// older than an instance of its batch delivered before: a relay offering a stale version
/// after the current one (rollback), or one the edge replaced.
fn refuse_known(inventory: &Inventory, earlier: &[InstanceRow]) -> Result<()> {
    if let Some(known) = earlier.iter().find(|e| e.instance == inventory.instance) {
        return Err(Replayed::again(known.clone()).into());
    }
    if let Some(newer) = earlier.iter().rev().find(|k| older_than(inventory, k)) {
        let superseded = Some((inventory.instance.clone(), inventory.generation));
        let known = newer.clone();
        return Err(Replayed { known, superseded }.into());
    }
    Ok(())
}

/// Whether the instance `inventory` signs is older than `known`, an instance of the same
/// batch: one the newer names as superseded; in the same epoch, a lower generation; across
/// epochs (an edge whose catalogue was replaced) or before format 3, an earlier seal time.
pub(super) fn older_than(inventory: &Inventory, known: &InstanceRow) -> bool {
    let supersedes =
        |list: &[forte_catalog::Earlier], id: &str| list.iter().any(|e| e.instance == id);
    let names = |list: &[forte_format::Superseded], id: &str| list.iter().any(|e| e.instance == id);
    if supersedes(&known.history.supersedes, &inventory.instance) {
        return true;
    }
    if names(&inventory.supersedes, &known.instance) {
        return false;
    }
    let same_epoch = inventory.names_its_history() && inventory.epoch == known.history.epoch;
    use std::cmp::Ordering::{Greater, Less};
    match (
        same_epoch,
        (inventory.generation as i64).cmp(&known.history.generation),
    ) {
        (true, Less) => true,
        (true, Greater) => false,
        // The same generation twice in one epoch (an edge catalogue restored from a copy),
        // or another epoch: the signed seal time.
        _ => inventory.sealed_at < known.sealed_at,
    }
}

/// The history `inventory` signs, as the catalogue keeps it.
fn history_of(inventory: &Inventory) -> History {
    History {
        epoch: inventory.epoch.clone(),
        epoch_from: inventory.epoch_from as i64,
        generation: inventory.generation as i64,
        supersedes: inventory
            .supersedes
            .iter()
            .map(|s| forte_catalog::Earlier {
                instance: s.instance.clone(),
                sequence: s.sequence as i64,
                content: s.content.clone(),
            })
            .collect(),
    }
}

impl std::error::Error for Replayed {}

impl Core<'_> {
    /// Checks who may file the batch where, from what the edge signed: the site named in its
    /// inventory must be the one the relay lists it under, its signer must be trusted for that
    /// site, and its instance must not have been delivered before ([`Replayed`]). `None` for a
    /// batch sealed before inventories named their instance (accepted only from keys trusted
    /// for any site).
    pub(super) fn check_custody(
        &self,
        key: &BatchKey,
        listed_site: &str,
        inventory: Option<&Inventory>,
    ) -> Result<Option<Instance>> {
        let Some(custody) = &self.custody else {
            return Ok(None);
        };
        let Some(inventory) = inventory else {
            return Ok(None);
        };
        check_signed_site(&custody.trusted.current(), inventory, listed_site)?;
        if !inventory.names_its_instance() {
            return Ok(None);
        }
        let earlier = self.delivered_instances(key, inventory)?;
        refuse_known(inventory, &earlier)?;
        // A new instance holding only files earlier instances of the batch delivered: the
        // relay replaying them (its tombstones removed, the edge sent them again), or an edge
        // whose catalogue was lost. Acknowledged with the receipt that covers them, not
        // delivered again. One that also holds new files is delivered (a follow-up bundles a
        // late small file with members delivered before): those are placed again only where
        // they are missing.
        let listed: HashSet<String> = inventory.objects.iter().map(|o| o.id.to_string()).collect();
        let delivered_before: HashSet<&String> = earlier
            .iter()
            .flat_map(|e| &e.objects)
            .filter(|id| listed.contains(*id))
            .collect();
        if !listed.is_empty() && delivered_before.len() == listed.len() {
            let last = earlier
                .into_iter()
                .rfind(|e| e.objects.iter().any(|id| listed.contains(id)))
                .expect("an earlier instance delivered them");
            return Err(Replayed::again(last).into());
        }
        if !delivered_before.is_empty() {
            tracing::warn!("batch {key}: instance {} lists {} file(s) delivered before beside {} new: the new ones are delivered, the others placed again only where missing",
                inventory.instance,
                delivered_before.len(),
                listed.len() - delivered_before.len()
            );
        }
        Ok(Some(Instance {
            site: inventory.site.clone(),
            batch: inventory.batch.clone(),
            id: inventory.instance.clone(),
            sequence: inventory.sequence,
            sealed_at: inventory.sealed_at,
            content: inventory.content(),
            objects: listed.into_iter().collect(),
            history: history_of(inventory),
        }))
    }

    /// Every instance of the batch of `inventory` delivered before, oldest first: those this
    /// catalogue recorded under `key`, and those the destination's own record holds under the
    /// batch's signed name (a catalogue new, restored or moved, or a relay that lists the
    /// batch under another id, does not make them unknown); and the very instance if the
    /// catalogue recorded it under another batch.
    fn delivered_instances(
        &self,
        key: &BatchKey,
        inventory: &Inventory,
    ) -> Result<Vec<InstanceRow>> {
        let catalogued = self.setup.catalog.instances_of(key)?;
        let same = self
            .setup
            .catalog
            .delivered_instance(&inventory.site, &inventory.instance)?;
        let kept = KeptInstances::at(self.setup.dest).of(&inventory.site, &inventory.batch)?;
        // Each instance once, as the catalogue has it if it has it.
        let mut by_id = std::collections::BTreeMap::new();
        for row in catalogued.into_iter().chain(same).chain(kept) {
            by_id.entry(row.instance.clone()).or_insert(row);
        }
        let mut known: Vec<InstanceRow> = by_id.into_values().collect();
        known.sort_by_key(|k| k.recorded_at);
        Ok(known)
    }

    /// Signs the receipt for `instance` (when the core has a receipt key) and records the
    /// instance as delivered with it, durably, before the relay may be told, in the statement
    /// that checks `held` still holds the batch ([`LeaseLost`] if not). When another worker
    /// recorded the same instance first, its receipt is the one returned.
    pub(super) fn keep_instance(
        &self,
        key: &BatchKey,
        held: &Held,
        instance: &Instance,
        outcome: Outcome,
        kept: &[forte_restore::Placed],
    ) -> Result<Option<Vec<u8>>> {
        let custody = self.custody.as_ref().expect("an instance implies custody");
        let files = kept
            .iter()
            .map(|p| ReceiptFile {
                id: p.id,
                size: p.size,
                sha256: p.sha256.clone(),
            })
            .collect();
        let now = now_us();
        let receipt = custody.receipt_key.map(|k| {
            Receipt::new(
                (&instance.site, &instance.id, instance.sequence),
                outcome,
                files,
                (&custody.destination, &self.setup.worker.name),
                now,
            )
            .sign(k)
        });
        let row = InstanceRow {
            role: Role::Core,
            site: instance.site.clone(),
            instance: instance.id.clone(),
            sequence: instance.sequence as i64,
            batch_key: key.clone(),
            content: instance.content.clone(),
            objects: instance.objects.clone(),
            sealed_at: instance.sealed_at,
            recorded_at: now,
            receipt: receipt
                .as_deref()
                .map(|r| String::from_utf8_lossy(r).into_owned()),
            history: instance.history.clone(),
        };
        // Beside the destination first, so that no catalogue can forget it; then in the
        // catalogue, under the lease.
        KeptInstances::at(self.setup.dest).add(&instance.batch, &row)?;
        match self.leases.record_delivered_instance(held.lease(), &row)? {
            Fenced::Recorded => Ok(receipt),
            Fenced::AlreadyRecorded => {
                // Delivered by another worker just now: its receipt is the one.
                let first = self
                    .setup
                    .catalog
                    .delivered_instance(&instance.site, &instance.id)?;
                Ok(first.and_then(|r| r.receipt).map(String::into_bytes))
            }
            Fenced::LeaseLost => Err(LeaseLost(format!(
                "batch {key}: this worker's lease ran out before it recorded the delivery; left to the worker holding it"
            ))
            .into()),
        }
    }

    /// The receipt the core keeps for a batch it delivered (the newest instance), to give
    /// again with an acknowledgement given again.
    pub(super) fn kept_receipt(&self, key: &BatchKey) -> Option<Vec<u8>> {
        let rows = self.setup.catalog.instances_of(key).ok()?;
        rows.into_iter()
            .filter_map(|r| r.receipt)
            .next_back()
            .map(String::into_bytes)
    }

    /// Alerts, once each, on every sequence number of a site that has not arrived although a
    /// later one arrived at least the configured time ago: a batch the relay dropped or holds
    /// back. Through the failure hook and standard error.
    pub fn alert_gaps(&self) {
        let Some(custody) = &self.custody else {
            return;
        };
        if !custody.looks.due(Instant::now()) {
            return;
        }
        let older_than = custody.gap_after.as_micros() as i64;
        // One read of the instances delivered since the last look, for both.
        let said = self
            .setup
            .catalog
            .sequence_alerts(&mut custody.numbers.lock(), older_than);
        let Ok(said) = said else {
            return;
        };
        for (site, error) in alerts(&mut custody.alerted.lock(), said.gaps) {
            custody.failures.alert(&site, &error);
        }
        for (site, error) in restarts(&mut custody.alerted.lock(), said.starts) {
            custody.failures.alert(&site, &error);
        }
    }
}

/// A sequence gap alerted on: its site and epoch, and the first and last missing number; or
/// a new epoch of a site (`first` its first number, `last` 0).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Alerted {
    site: String,
    epoch: String,
    first: i64,
    last: i64,
}

/// The alert (site, text) of each new sequence epoch not in `alerted` yet, which then holds
/// it: an edge that numbers from 1 again (its catalogue replaced) is said once, so numbers
/// going back are seen, and the old epoch's numbers never come.
fn restarts(
    alerted: &mut HashSet<Alerted>,
    starts: Vec<forte_catalog::EpochStart>,
) -> Vec<(String, String)> {
    starts
        .into_iter()
        .filter(|s| {
            alerted.insert(Alerted {
                site: s.site.clone(),
                epoch: s.epoch.clone(),
                first: s.from,
                last: 0,
            })
        })
        .map(|s| {
            let error = format!(
                "site {}: its edge started numbering its batches again at {} (sequence epoch {}, first seen at {}), after number {} of epoch {}: its catalogue was replaced or is new; numbers after {} of the old epoch will not come",
                s.site,
                s.from,
                s.epoch,
                format_utc(s.since),
                s.after_last,
                if s.after_epoch.is_empty() { "(before epochs)" } else { &s.after_epoch },
                s.after_last
            );
            (s.site, error)
        })
        .collect()
}

/// The alert (site, text) of each of `gaps` not in `alerted` yet, which then holds it: each
/// gap is alerted on once, and again only if it grows.
fn alerts(alerted: &mut HashSet<Alerted>, gaps: Vec<Gap>) -> Vec<(String, String)> {
    gaps.into_iter()
        .filter(|gap| {
            alerted.insert(Alerted {
                site: gap.site.clone(),
                epoch: gap.epoch.clone(),
                first: gap.first,
                last: gap.last,
            })
        })
        .map(|gap| {
            let numbers = if gap.first == gap.last {
                format!("batch sequence number {} is", gap.first)
            } else {
                format!("batch sequence numbers {} to {} are", gap.first, gap.last)
            };
            let error = format!(
                "site {}: {numbers} missing, though {} arrived at {} (a batch dropped or held back at the relay, or cancelled at the edge)",
                gap.site,
                gap.after,
                format_utc(gap.since)
            );
            (gap.site, error)
        })
        .collect()
}

/// Refuses a batch unless it may be filed under `listed_site`, the site the relay lists it
/// under: its inventory signed for that very site by a key trusted for it; a version-1
/// inventory, which names no site, only by a key trusted for that site (a key given without a
/// site is trusted for any).
fn check_signed_site(
    trusted: &TrustedEdges,
    inventory: &Inventory,
    listed_site: &str,
) -> Result<()> {
    let signer = inventory
        .signer
        .as_ref()
        .expect("an opened inventory names its signer");
    let signer_id = forte_format::keys::edge_key_id(signer);
    if !inventory.names_its_instance() {
        if !trusted.may_sign_for(signer, listed_site) {
            bail!("the batch's inventory (format 1) names no site, and edge key {signer_id} is not trusted for site {listed_site} (--trust {listed_site}=FILE)");
        }
        return Ok(());
    }
    if inventory.site != listed_site {
        bail!(
            "the relay lists this batch under site {listed_site}, but its edge signed it for site {:?}: refused, nothing delivered (a relay that moved it between sites, or an edge with the wrong --site)",
            inventory.site
        );
    }
    if !trusted.may_sign_for(signer, &inventory.site) {
        bail!(
            "the batch is signed for site {} by edge key {signer_id}, which is not trusted for that site (--trust {}=FILE binds a key to it): refused, nothing delivered",
            inventory.site,
            inventory.site
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use forte_format::{Instance, TrustSpec, INVENTORY_FORMAT_V1};

    /// An edge key, trusted as `spec` says (`SITE=` or nothing before the key file), and an
    /// inventory it opened: signed for `site`, or of format 1 when `site` is `None`.
    fn signed(spec: &str, site: Option<&str>) -> (TrustedEdges, Inventory) {
        let dir = tempfile::tempdir().unwrap();
        let keys = forte_format::keys::generate(dir.path()).unwrap();
        let spec: TrustSpec = format!("{spec}{}", keys.edge_pub.display())
            .parse()
            .unwrap();
        let trusted = TrustedEdges::load(&[spec]).unwrap();
        let key = forte_format::EdgeKey::load(&keys.edge_key).unwrap();
        let mut inventory = Inventory::new("b", Instance::new(site.unwrap_or(""), 1, 0), vec![]);
        if site.is_none() {
            inventory.format = INVENTORY_FORMAT_V1.into();
            inventory.instance.clear();
        }
        inventory.signer = Some(key.0.verifying_key());
        (trusted, inventory)
    }

    fn refused(trusted: &TrustedEdges, inventory: &Inventory, listed: &str) -> String {
        format!(
            "{:#}",
            check_signed_site(trusted, inventory, listed).unwrap_err()
        )
    }

    /// Gaps are looked for at once, then every tenth of the alert's delay (one to ten
    /// seconds), not at every idle second of a watching puller.
    #[test]
    fn gaps_are_looked_for_every_tenth_of_the_alerts_delay() {
        let secs = Duration::from_secs;
        for (gap_after, every) in [
            (secs(2), secs(1)),
            (secs(60), secs(6)),
            (secs(600), secs(10)),
        ] {
            let looks = Looks::for_gaps(gap_after);
            assert_eq!(looks.every, every);
            let t0 = Instant::now();
            assert!(looks.due(t0), "the first look is at once");
            assert!(!looks.due(t0 + every / 2));
            assert!(!looks.due(t0 + every - Duration::from_nanos(1)));
            assert!(looks.due(t0 + every));
            assert!(!looks.due(t0 + every + every / 2));
        }
    }

    /// A gap is alerted on once, and again only when it grows.
    #[test]
    fn each_gap_is_alerted_on_once() {
        let gap = |first, last| Gap {
            site: "site-a".into(),
            epoch: String::new(),
            first,
            last,
            after: last + 1,
            since: 0,
        };
        let mut alerted = HashSet::new();
        let first = alerts(&mut alerted, vec![gap(3, 3)]);
        assert_eq!(first.len(), 1);
        assert!(
            first[0]
                .1
                .starts_with("site site-a: batch sequence number 3 is missing, though 4 arrived"),
            "{}",
            first[0].1
        );
        assert!(alerts(&mut alerted, vec![gap(3, 3)]).is_empty());
        let grown = alerts(&mut alerted, vec![gap(3, 5)]);
        assert_eq!(grown.len(), 1);
        assert!(
            grown[0].1.contains("numbers 3 to 5 are missing"),
            "{}",
            grown[0].1
        );
    }

    #[test]
    fn a_batch_is_filed_only_under_the_site_its_edge_signed() {
        let (trusted, inventory) = signed("", Some("site-a"));
        check_signed_site(&trusted, &inventory, "site-a").unwrap();
        let why = refused(&trusted, &inventory, "site-b");
        assert!(why.contains("signed it for site \"site-a\""), "{why}");
    }

    #[test]
    fn a_key_bound_to_a_site_signs_for_no_other() {
        let (trusted, inventory) = signed("site-b=", Some("site-a"));
        let why = refused(&trusted, &inventory, "site-a");
        assert!(why.contains("not trusted for that site"), "{why}");
        let (trusted, inventory) = signed("site-a=", Some("site-a"));
        check_signed_site(&trusted, &inventory, "site-a").unwrap();
    }

    /// A format-1 inventory names no site: filed where the relay lists it only if its key is
    /// trusted for that site.
    #[test]
    fn a_format_1_batch_needs_a_key_trusted_for_the_site_it_is_listed_under() {
        let (trusted, inventory) = signed("site-b=", None);
        assert!(!inventory.names_its_instance());
        let why = refused(&trusted, &inventory, "site-a");
        assert!(why.contains("(format 1) names no site"), "{why}");
        check_signed_site(&trusted, &inventory, "site-b").unwrap();
        let (any, inventory) = signed("", None);
        check_signed_site(&any, &inventory, "site-a").unwrap();
    }

    /// A delivered instance of the batch, of `epoch` and `generation`, sealed at `sealed_at`,
    /// naming `supersedes` as the instances it replaces.
    fn known(
        instance: &str,
        epoch: &str,
        generation: i64,
        sealed_at: i64,
        supersedes: &[&str],
    ) -> InstanceRow {
        InstanceRow {
            role: Role::Core,
            site: "site-a".into(),
            instance: instance.into(),
            sequence: generation,
            batch_key: BatchKey::core("site-a", "b"),
            content: String::new(),
            objects: Vec::new(),
            sealed_at,
            recorded_at: 0,
            receipt: None,
            history: History {
                epoch: epoch.into(),
                epoch_from: 1,
                generation,
                supersedes: supersedes
                    .iter()
                    .map(|i| forte_catalog::Earlier {
                        instance: i.to_string(),
                        sequence: 0,
                        content: String::new(),
                    })
                    .collect(),
            },
        }
    }

    /// An inventory of instance `instance`, of `epoch` (empty: format 2) and `generation`,
    /// sealed at `sealed_at`, superseding `supersedes`.
    fn offered(
        instance: &str,
        epoch: &str,
        generation: u64,
        sealed_at: i64,
        supersedes: &[&str],
    ) -> Inventory {
        let mut inventory =
            Inventory::new("b", Instance::new("site-a", generation, sealed_at), vec![]);
        inventory.instance = instance.into();
        inventory.epoch = epoch.into();
        inventory.generation = generation;
        inventory.supersedes = supersedes
            .iter()
            .map(|i| forte_format::Superseded {
                content: String::new(),
                instance: i.to_string(),
                sequence: 0,
            })
            .collect();
        if epoch.is_empty() {
            inventory.format = forte_format::INVENTORY_FORMAT_V2.into();
        }
        inventory
    }

    /// Which of two instances of one batch is older: the one the other names as superseded;
    /// else in one epoch the lower generation; else (another epoch, or format 2) the earlier
    /// seal; the same generation twice in an epoch, by seal time.
    #[test]
    fn an_instance_is_older_as_its_history_says() {
        // Named as superseded by the known one, whatever its generation or time.
        assert!(older_than(
            &offered("i1", "e", 9, 99, &[]),
            &known("i2", "e", 2, 1, &["i1"])
        ));
        // Naming the known one as superseded: newer, whatever its generation or time.
        assert!(!older_than(
            &offered("i2", "e", 1, 0, &["i1"]),
            &known("i1", "e", 5, 9, &[])
        ));
        // One epoch: the generation decides, not the seal time.
        assert!(older_than(
            &offered("i1", "e", 1, 50, &[]),
            &known("i2", "e", 2, 10, &[])
        ));
        assert!(!older_than(
            &offered("i3", "e", 3, 5, &[]),
            &known("i2", "e", 2, 10, &[])
        ));
        // The same generation twice (a restored edge catalogue): the seal time.
        assert!(older_than(
            &offered("i1", "e", 2, 5, &[]),
            &known("i2", "e", 2, 10, &[])
        ));
        assert!(!older_than(
            &offered("i1", "e", 2, 15, &[]),
            &known("i2", "e", 2, 10, &[])
        ));
        // Sealed in the same microsecond: not older (nothing tells them apart; delivered).
        for (epoch, other) in [("e", "e"), ("e1", "e2")] {
            let same_time = older_than(
                &offered("i1", epoch, 2, 10, &[]),
                &known("i2", other, 2, 10, &[]),
            );
            assert!(!same_time, "{epoch} {other}");
        }
        // Another epoch, or format 2: the seal time, not the generation.
        assert!(older_than(
            &offered("i1", "e1", 5, 5, &[]),
            &known("i2", "e2", 1, 10, &[])
        ));
        assert!(!older_than(
            &offered("i1", "e1", 1, 15, &[]),
            &known("i2", "e2", 5, 10, &[])
        ));
        assert!(older_than(
            &offered("i1", "", 0, 5, &[]),
            &known("i2", "", 0, 10, &[])
        ));
        assert!(!older_than(
            &offered("i1", "", 0, 15, &[]),
            &known("i2", "", 0, 10, &[])
        ));
        // A format-2 inventory whose (empty) epoch equals a format-2 row's is no generation.
        assert!(!older_than(
            &offered("i1", "", 0, 15, &[]),
            &known("i2", "", 3, 10, &[])
        ));
    }

    /// The known instance itself is a replay; an older one is superseded by the newest that
    /// makes it older; a newer one passes.
    #[test]
    fn a_known_or_older_instance_is_refused_and_a_newer_one_passes() {
        let earlier = [known("i1", "e", 1, 1, &[]), known("i2", "e", 2, 2, &["i1"])];
        let again = refuse_known(&offered("i2", "e", 2, 2, &["i1"]), &earlier).unwrap_err();
        let again = again.downcast::<Replayed>().unwrap();
        assert_eq!(
            (again.known.instance.as_str(), again.superseded),
            ("i2", None)
        );
        let old = refuse_known(&offered("i0", "e", 1, 0, &[]), &earlier).unwrap_err();
        let old = old.downcast::<Replayed>().unwrap();
        assert_eq!(old.known.instance, "i2", "the newest that makes it older");
        assert_eq!(old.superseded, Some(("i0".to_string(), 1)));
        assert!(
            old.to_string()
                .starts_with("superseded: instance i0 (generation 1)"),
            "{old}"
        );
        refuse_known(&offered("i3", "e", 3, 3, &["i1", "i2"]), &earlier).unwrap();
    }

    /// A new epoch is said once, naming where the old one ended.
    #[test]
    fn a_new_epoch_is_said_once() {
        let start = forte_catalog::EpochStart {
            site: "site-a".into(),
            epoch: "e2".into(),
            from: 1,
            after_epoch: "e1".into(),
            after_last: 7,
            since: 0,
        };
        let mut alerted = HashSet::new();
        let said = restarts(&mut alerted, vec![start.clone()]);
        assert_eq!(said.len(), 1);
        assert!(
            said[0]
                .1
                .contains("started numbering its batches again at 1"),
            "{}",
            said[0].1
        );
        assert!(
            said[0].1.contains("after number 7 of epoch e1"),
            "{}",
            said[0].1
        );
        assert!(restarts(&mut alerted, vec![start]).is_empty());
    }
}
