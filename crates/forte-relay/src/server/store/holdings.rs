//! What the relay holds, per site and batch, for operators (`forte relay-store list`), and
//! the objects it holds not delivered yet, which cancelling and expiry go through.

use forte_format::ObjectId;

use super::keys::{batch_key, SEALED_RECORD};
use super::status::Listed;
use super::{Result, Store};
use crate::api::ReadyObject;

/// What the relay holds of one batch of one site (`batch` is `None` for objects not sealed
/// yet, whose batch the relay cannot know).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Holding {
    pub site: String,
    pub batch: Option<String>,
    /// The edge sealed the batch: it is waiting for the core.
    pub batch_sealed: bool,
    pub objects: usize,
    pub bytes: u64,
    /// Seconds since the epoch of the oldest and newest change among its objects.
    pub oldest: u64,
    pub newest: u64,
}

/// One object the relay holds, not delivered yet.
pub(super) struct HeldObject {
    pub(super) id: ObjectId,
    /// The batch it was sealed into; `None` while open.
    pub(super) batch: Option<String>,
    bytes: u64,
    /// When it last changed, in seconds since the epoch.
    pub(super) changed: u64,
}

impl Store {
    /// Sites with anything stored.
    pub(super) fn sites(&self) -> Result<Vec<String>> {
        let mut sites = self.backend.children("sites", "listing of sites")?;
        sites.sort();
        Ok(sites)
    }

    /// The objects of one site not delivered yet.
    pub(super) fn held_objects(&self, site: &str) -> Result<Vec<HeldObject>> {
        let what = format!("objects of site {site}");
        let Listed { records, bodies } = self.listed_by_object(site, &what)?;
        let mut held = Vec::new();
        for (id, records) in records {
            let mut o = HeldObject {
                id,
                batch: None,
                bytes: 0,
                changed: 0,
            };
            for e in records {
                o.changed = o.changed.max(e.modified);
                if e.name() == SEALED_RECORD {
                    o.batch = self
                        .backend
                        .get(&e.key, &what)?
                        .and_then(|b| serde_json::from_slice::<ReadyObject>(&b).ok())
                        .map(|r| r.batch);
                }
            }
            // Its records say when it last changed: each part's is written with the part.
            o.bytes = bodies.get(&id).into_iter().flatten().map(|e| e.size).sum();
            held.push(o);
        }
        Ok(held)
    }

    /// What the relay holds, per site and batch, for operators (`forte relay-store list`).
    pub fn holdings(&self) -> Result<Vec<Holding>> {
        let mut out: Vec<Holding> = Vec::new();
        for site in self.sites()? {
            for o in self.held_objects(&site)? {
                let sealed = match &o.batch {
                    Some(b) => self.backend.exists(&batch_key(&site, b), "batch record")?,
                    None => false,
                };
                let key = (site.clone(), o.batch.clone());
                match out
                    .iter_mut()
                    .find(|h| (h.site.clone(), h.batch.clone()) == key)
                {
                    Some(h) => {
                        h.objects += 1;
                        h.bytes += o.bytes;
                        h.oldest = h.oldest.min(o.changed);
                        h.newest = h.newest.max(o.changed);
                    }
                    None => out.push(Holding {
                        site: site.clone(),
                        batch: o.batch,
                        batch_sealed: sealed,
                        objects: 1,
                        bytes: o.bytes,
                        oldest: o.changed,
                        newest: o.changed,
                    }),
                }
            }
        }
        out.sort_by(|a, b| (&a.site, &a.batch).cmp(&(&b.site, &b.batch)));
        Ok(out)
    }
}
