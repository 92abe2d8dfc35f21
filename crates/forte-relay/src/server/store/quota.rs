//! The quota: the bytes each site holds ([`Quota`], the ledger), charged before an upload's
//! bytes are written, and what a sender is told when they do not fit (wait for the core, or
//! nothing will free space).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::keys::site_key;
use super::{Result, Store, StoreError};

/// How old a site's byte count from a shared bucket may be when a quota is checked.
const RECOUNT_AFTER: Duration = Duration::from_secs(2);

/// The bytes each site holds, as counted for its quota; the only figures the store keeps in
/// memory besides its caches.
pub(super) struct Quota {
    /// Most bytes one site may hold; `None`: no limit (the bytes are counted all the same).
    limit: Option<u64>,
    /// Bytes held per site, for the quota; rebuilt from the store at start.
    usage: Mutex<HashMap<String, u64>>,
    /// When each site's bytes were last counted from a shared bucket.
    counted: Mutex<HashMap<String, Instant>>,
}

impl Quota {
    pub(super) fn new(limit: Option<u64>) -> Self {
        Self {
            limit,
            usage: Mutex::default(),
            counted: Mutex::default(),
        }
    }

    /// Counts `delta` bytes more (or fewer) held by the site, whatever its quota.
    pub(super) fn add(&self, site: &str, delta: i64) {
        let mut usage = self.usage.lock();
        let used = usage.entry(site.to_string()).or_default();
        *used = used.saturating_add_signed(delta);
    }

    /// Sets the bytes the site holds, as counted in the store.
    fn set(&self, site: &str, bytes: u64) {
        self.usage.lock().insert(site.to_string(), bytes);
    }

    /// Whether the site's figure is due to be counted again from a shared bucket (never
    /// counted, or longer ago than [`RECOUNT_AFTER`]); if so, it counts as counted now.
    fn recount_due(&self, site: &str) -> bool {
        let mut counted = self.counted.lock();
        let last = counted.get(site).copied();
        let due = last.is_none_or(|at| at.elapsed() >= RECOUNT_AFTER);
        if due {
            counted.insert(site.to_string(), Instant::now());
        }
        due
    }

    /// Counts `size` more bytes against the site if they fit in its quota, under one lock, so
    /// uploads arriving together cannot all pass the check on the same figure; why not if
    /// they do not.
    fn take(&self, site: &str, size: i64) -> std::result::Result<(), String> {
        let Some(quota) = self.limit else {
            self.add(site, size);
            return Ok(());
        };
        let mut usage = self.usage.lock();
        let used = usage.entry(site.to_string()).or_default();
        if used.saturating_add_signed(size) > quota {
            let held = *used;
            // Over the quota with this upload, not necessarily at it before.
            return Err(if held < quota {
                format!("{size} bytes do not fit in site {site}'s quota: {held} of {quota} bytes held, {} free", quota - held)
            } else {
                format!("site {site} is at its quota ({held} of {quota} bytes held)")
            });
        }
        *used = used.saturating_add_signed(size);
        Ok(())
    }
}

impl Store {
    /// Counts `size` more bytes against the site before they are written, under one lock, so
    /// uploads arriving together cannot all pass the quota check on the same figure.
    pub(super) fn charge(&self, site: &str, size: i64) -> Result<()> {
        if self.quota.limit.is_some() {
            self.recount_if_shared(site)?;
        }
        self.quota
            .take(site, size)
            .map_err(|why| self.no_room_unless_waiting(&[site.to_string()], why))
    }

    /// Relays sharing a bucket each count their own uploads: the site's figure is taken again
    /// from the bucket when it is older than [`RECOUNT_AFTER`], so what the others stored or
    /// freed counts too (uploads under way in this relay meanwhile are counted once written).
    fn recount_if_shared(&self, site: &str) -> Result<()> {
        if !self.backend.shared() {
            return Ok(());
        }
        if self.quota.recount_due(site) {
            self.count_usage(site)?;
        }
        Ok(())
    }

    /// Sets the site's figure for the quota to the bytes its objects hold in the store.
    pub(super) fn count_usage(&self, site: &str) -> Result<()> {
        let held = self
            .backend
            .list(&format!("{}/objects", site_key(site)), "usage")?;
        let bytes = held.iter().map(|e| e.size).sum();
        self.quota.set(site, bytes);
        Ok(())
    }

    /// A full store met while writing: see [`Store::no_room_unless_waiting`].
    pub(super) fn no_room_unless_waiting_if_full(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::Full(why) => self.no_room_unless_waiting(&["*".to_string()], why),
            e => e,
        }
    }

    /// A full store is worth waiting for only while the core has sealed batches to pull of
    /// `sites` (`*` for all): pulling them frees space. Otherwise nothing will, and the sender
    /// must be told at once what to do.
    fn no_room_unless_waiting(&self, sites: &[String], why: String) -> StoreError {
        if !self.ready(sites, false).is_empty() {
            return StoreError::Full(format!("{why}; retry after the core has pulled"));
        }
        StoreError::NoRoom(format!(
            "{why}, and nothing in it is waiting for the core: all of it belongs to batches not sealed yet, so no pull can free space. A batch larger than the relay's space can never be sealed there: raise the relay's --quota-per-site or its disk, cancel the batch (`forte send INBOX --cancel BATCH` at the edge, or `forte relay-store cancel` at the relay), or split it into smaller batches"
        ))
    }
}
