//! Fetching ahead: the sealed objects of a batch the edge is still sending are verified and
//! staged as they come, so that little is left to do when its seal arrives.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use forte_catalog::{now_us, BatchKey, Stage};
use forte_format::ObjectId;
use forte_relay::api::ReadyObject;
use forte_restore::{new_staging, Restore, Staged};
use parking_lot::Mutex;

use super::lease::Held;
use super::DOWNLOAD_RETRY;
use super::{batch_key_of, Core};
use crate::download::RelaySource;
use crate::layout::Fields;
use forte_daemon::record::note;

/// A batch fetched ahead of its seal: objects verified and staged, nothing visible yet.
pub(super) struct Ahead {
    pub(super) staging: PathBuf,
    pub(super) staged: Staged,
    pub(super) started_at: i64,
    pub(super) started: Instant,
    /// Fixed by the first objects fetched, so every file of the batch gets the same layout.
    batch_time: u64,
    pub(super) name: Option<String>,
    /// Fetching ahead failed once: the batch is left for the whole pull after its seal,
    /// which reports what is wrong.
    pub(super) failed: bool,
    /// This worker's lease on the batch, released with the staging directory unless the
    /// delivery takes it over.
    pub(super) held: Option<Held>,
    /// Every object fetching ahead was given, staged or not: each is fetched ahead once.
    /// Some stage under other ids (a bundle's files) or not at all (refused); asking for them
    /// again at every look kept a watching puller busy for as long as the batch stayed open.
    asked: HashSet<ObjectId>,
}

impl Ahead {
    /// Whether another worker took the batch over (this one stalled past its lease).
    fn lost(&self) -> bool {
        self.held.as_ref().is_none_or(Held::lost)
    }

    /// Those of `objects` not fetched ahead before, now counted as fetched.
    fn not_asked(&mut self, objects: Vec<ReadyObject>) -> Vec<ReadyObject> {
        let new = self.not_staged(objects);
        new.into_iter()
            .filter(|o| self.asked.insert(o.id))
            .collect()
    }

    /// Those of `objects` not staged yet.
    pub(super) fn not_staged(&self, objects: Vec<ReadyObject>) -> Vec<ReadyObject> {
        let held: HashSet<ObjectId> = self.staged.ids().collect();
        objects
            .into_iter()
            .filter(|o| !held.contains(&o.id))
            .collect()
    }
}

/// When a batch's pull began: the clock its duration is measured on, and the catalogue's
/// time (µs) its pull stage starts at.
#[derive(Debug, Clone, Copy)]
pub(super) struct PullStart {
    pub(super) started: Instant,
    pub(super) started_at: i64,
}

/// A sealed batch taken for delivery: when its pull began, and what was fetched ahead of it
/// (or a fresh start), or why it cannot start.
pub(super) struct Taken {
    pub(super) start: PullStart,
    pub(super) ahead: Result<Ahead>,
}

impl Drop for Ahead {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.staging);
    }
}

impl Core<'_> {
    /// What was fetched ahead of a sealed batch, kept only if it all verified; else a fresh
    /// start, whose pull stage begins now. With when the batch's pull started. `None` when
    /// another worker holds the batch.
    pub(super) fn take_ahead(&self, key: &BatchKey, objects: &[ReadyObject]) -> Option<Taken> {
        let held = match self.ahead.lock().remove(key) {
            Some(ahead) if !ahead.lost() && !ahead.failed => {
                let start = PullStart {
                    started: ahead.started,
                    started_at: ahead.started_at,
                };
                return Some(Taken {
                    start,
                    ahead: Ok(ahead),
                });
            }
            // Fetching ahead failed: start afresh, under the same lease.
            Some(mut ahead) if !ahead.lost() => ahead.held.take(),
            Some(_) => {
                tracing::warn!("{}", taken_over(key));
                None
            }
            None => None,
        };
        let (started, started_at) = (Instant::now(), now_us());
        let start = PullStart {
            started,
            started_at,
        };
        let held = match held.map_or_else(|| self.claim(key), |h| Ok(Some(h))) {
            Ok(Some(held)) => held,
            Ok(None) => return None,
            Err(e) => {
                return Some(Taken {
                    start,
                    ahead: Err(e),
                })
            }
        };
        note(
            "a stage",
            self.setup.catalog.stage(key, Stage::Pull, started_at, None),
        );
        let ahead = self.fresh_ahead(objects, held, started, started_at);
        Some(Taken { start, ahead })
    }

    /// Claims `key` for this worker: `None` while another worker holds it.
    fn claim(&self, key: &BatchKey) -> Result<Option<Held>> {
        Held::claim(&self.leases, &self.setup.worker, key)
    }

    /// Verifies and stages the sealed objects of a batch the edge is still sending, so that
    /// little is left to do when its seal arrives. Nothing becomes visible and nothing is
    /// acknowledged. Returns whether there was anything new to fetch. A batch another worker
    /// holds is left to it.
    pub fn fetch_ahead(&self, restore: &Restore, objects: Vec<ReadyObject>) -> bool {
        let batch_key = batch_key_of(&objects);
        let mut all = self.ahead.lock();
        if all.get(&batch_key).is_some_and(Ahead::lost) {
            tracing::warn!("{}", taken_over(&batch_key));
            all.remove(&batch_key);
            return false;
        }
        if all.get(&batch_key).is_some_and(|a| a.failed) {
            return false;
        }
        if !all.contains_key(&batch_key) {
            let held = match self.claim(&batch_key) {
                Ok(Some(held)) => held,
                Ok(None) => return false,
                Err(e) => {
                    tracing::warn!("batch {batch_key}: not fetched ahead: {e:#}");
                    return false;
                }
            };
            let Ok(ahead) = self.fresh_ahead(&objects, held, Instant::now(), now_us()) else {
                return false;
            };
            note(
                "a stage",
                self.setup
                    .catalog
                    .stage(&batch_key, Stage::Pull, ahead.started_at, None),
            );
            all.insert(batch_key.clone(), ahead);
        }
        let ahead = all.get_mut(&batch_key).expect("inserted above");
        let new = ahead.not_asked(objects);
        if new.is_empty() {
            return false;
        }
        match self.stage(restore, new, &batch_key, ahead) {
            Ok(more) => ahead.staged.extend(more),
            Err(e) => {
                tracing::warn!("batch {batch_key}: fetching ahead failed, the batch will be pulled whole after its seal: {e:#}");
                ahead.failed = true;
            }
        }
        true
    }

    pub(super) fn fresh_ahead(
        &self,
        objects: &[ReadyObject],
        held: Held,
        started: Instant,
        started_at: i64,
    ) -> Result<Ahead> {
        Ok(Ahead {
            staging: new_staging(self.setup.dest)?,
            staged: Staged::default(),
            started_at,
            started,
            batch_time: objects.iter().map(|o| o.sealed_at).min().unwrap_or(0),
            name: None,
            failed: false,
            held: Some(held),
            asked: HashSet::new(),
        })
    }

    /// Verifies `objects` and stages them in the batch's staging directory.
    pub(super) fn stage(
        &self,
        restore: &Restore,
        objects: Vec<ReadyObject>,
        batch_key: &BatchKey,
        ahead: &mut Ahead,
    ) -> Result<Staged> {
        let site = objects[0].site.clone();
        let fallback = objects[0].batch.clone();
        let source = RelaySource {
            client: self.setup.client,
            retry: DOWNLOAD_RETRY,
            catalog: self.setup.catalog,
            batch_key,
            objects,
        };
        // The relay knows batches by opaque ids; the name is inside the verified manifests.
        let name = Mutex::new(ahead.name.clone());
        let relay_time = ahead.batch_time;
        // Where a file goes comes from what its edge signed (format 4): its site, which must
        // be the one the relay lists it under, and its batch's time. Only an older manifest,
        // which names neither, is filed by the relay's seal time.
        let place = |m: &forte_format::Manifest| -> Result<String> {
            let batch_time = match m.signed_origin() {
                Some((signed, _)) if signed != site => bail!(
                    "signed for site {signed:?}, but the relay lists it under site {site:?}: refused (a relay filing one site's data under another)"
                ),
                Some(_) if m.batch.is_empty() => {
                    bail!("signed in no batch, but the relay lists it in batch {fallback}: refused")
                }
                Some((_, time)) => u64::try_from(time).unwrap_or(0),
                None => relay_time,
            };
            let batch = if m.batch.is_empty() {
                fallback.as_str()
            } else {
                m.batch.as_str()
            };
            name.lock().get_or_insert_with(|| batch.to_string());
            self.setup.layout.target(&Fields {
                site: &site,
                batch,
                path: &m.path,
                batch_time,
            })
        };
        let staged = restore.stage(&source, self.setup.dest, &place, &ahead.staging);
        ahead.name = name.into_inner();
        staged
    }
}

/// What a worker says when it finds that a batch it fetched ahead was taken over (it stalled
/// past its lease).
fn taken_over(key: &BatchKey) -> String {
    format!("batch {key}: another worker took it over while this one fetched it ahead; left to it")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(id: ObjectId) -> ReadyObject {
        ReadyObject {
            site: "s".into(),
            id,
            batch: "b".into(),
            parts: Vec::new(),
            sealed_at: 0,
            batch_sealed: false,
        }
    }

    /// An object fetched ahead that staged nothing under its own id (a bundle's files, or one
    /// refused) is not fetched again at the next look: it was, at every look, and a watching
    /// puller spun for as long as its batch stayed open. The pull after the seal still
    /// fetches it.
    #[test]
    fn each_object_is_fetched_ahead_once_and_the_sealed_pull_takes_the_rest() {
        let staging = tempfile::tempdir().unwrap();
        let mut ahead = Ahead {
            staging: staging.path().join("staging"),
            staged: Staged::default(),
            started_at: 0,
            started: Instant::now(),
            batch_time: 0,
            name: None,
            failed: false,
            held: None,
            asked: HashSet::new(),
        };
        let (a, b) = (ObjectId::random(), ObjectId::random());
        let first = ahead.not_asked(vec![object(a), object(b)]);
        assert_eq!(first.len(), 2);
        assert!(ahead.not_asked(vec![object(a), object(b)]).is_empty());
        assert_eq!(ahead.not_staged(vec![object(a), object(b)]).len(), 2);
    }
}
