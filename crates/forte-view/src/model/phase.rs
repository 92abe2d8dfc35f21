//! Where a batch is on its way edge → relay → core, told from every row the view's
//! catalogues hold of it: one state that moves forward, whichever node recorded what. The edge
//! and the core each keep a row of the same batch (the core's key is the edge's id under the
//! site), so a view over both would otherwise show every batch twice, the edge's row saying
//! "sent" long after the core delivered it.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::Result;
use forte_catalog::{BatchRow, BatchState, Catalog, Role};
use serde::Serialize;

/// A batch's place on its way, as the operator follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Ready in the edge's inbox, waiting for its turn.
    AtEdge,
    /// Its files going up to the relay.
    Sending,
    /// Sealed at the relay, not yet taken by the core.
    AtRelay,
    /// The core taking it from the relay and verifying it.
    Pulling,
    /// Verified at the core; its site tasks run before it is promoted.
    Checking,
    /// Promoted at the core (at the edge: a receipt signed by the core says so).
    Delivered,
    /// Kept aside at the core: a site task refused it.
    Quarantined,
    /// Stopped by an error that needs the operator.
    Failed,
    /// Cancelled at the edge, or refused by a site task there.
    Stopped,
}

impl Phase {
    /// The phase one node's row says on its own. `receipted`: the edge holds a receipt of the
    /// core for it, verified with a trusted core key.
    pub fn of_row(role: Role, state: BatchState, receipted: bool) -> Self {
        match (role, state) {
            (Role::Edge, BatchState::Queued) => Self::AtEdge,
            (Role::Edge, BatchState::Sent) if receipted => Self::Delivered,
            (Role::Edge, BatchState::Sent) | (Role::Core, BatchState::Queued) => Self::AtRelay,
            // Sources are deleted (or kept for good) only on the core's verified receipts.
            (Role::Edge, BatchState::SourceDeleted | BatchState::SourceKept) => Self::Delivered,
            (_, BatchState::Sending) => Self::Sending,
            (_, BatchState::Pulling) => Self::Pulling,
            (_, BatchState::Checking) => Self::Checking,
            (_, BatchState::Delivered) => Self::Delivered,
            (_, BatchState::Quarantined) => Self::Quarantined,
            (_, BatchState::Failed) => Self::Failed,
            (_, BatchState::Cancelled | BatchState::Refused) => Self::Stopped,
            // A core row is never queued at the edge nor sent by it; read as the relay holding it.
            (Role::Core, _) => Self::AtRelay,
        }
    }

    /// Whether the batch's journey has ended, well or not.
    pub fn ended(self) -> bool {
        matches!(
            self,
            Self::Delivered | Self::Quarantined | Self::Failed | Self::Stopped
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AtEdge => "at_edge",
            Self::Sending => "sending",
            Self::AtRelay => "at_relay",
            Self::Pulling => "pulling",
            Self::Checking => "checking",
            Self::Delivered => "delivered",
            Self::Quarantined => "quarantined",
            Self::Failed => "failed",
            Self::Stopped => "stopped",
        }
    }

    /// Words for the page.
    pub fn text(self) -> &'static str {
        match self {
            Self::AtEdge => "at the edge",
            Self::Sending => "sending",
            Self::AtRelay => "at the relay",
            Self::Pulling => "pulling",
            Self::Checking => "checking",
            Self::Delivered => "delivered",
            Self::Quarantined => "quarantined",
            Self::Failed => "failed",
            Self::Stopped => "stopped",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every row one batch has in the catalogues read: the edge's and the core's.
pub(super) struct Journey<'c> {
    /// Which of the catalogues read holds the row in charge (a link names it: two edges'
    /// catalogues may hold a batch of one id).
    pub(super) catalogs: &'c [Catalog],
    pub(super) edge: Option<(&'c Catalog, BatchRow)>,
    pub(super) core: Option<(&'c Catalog, BatchRow)>,
    /// The edge holds a verified receipt of the core for it.
    pub(super) receipted: bool,
    /// Its site, from the core's row or the edge's seal.
    pub(super) site: String,
}

impl<'c> Journey<'c> {
    /// The row that says where the batch is now: the edge's while it sends (a follow-up sent
    /// after delivery included), else the core's once the core has one, else the edge's.
    pub(super) fn in_charge(&self) -> &(&'c Catalog, BatchRow) {
        match (&self.edge, &self.core) {
            (Some(e), _) if super::running(e.1.state) => e,
            (_, Some(c)) => c,
            (Some(e), None) => e,
            (None, None) => unreachable!("a journey has a row"),
        }
    }

    pub(super) fn phase(&self) -> Phase {
        let (_, row) = self.in_charge();
        let phase = Phase::of_row(row.role, row.state, self.receipted);
        // The relay holding it: but the edge may know more, from the core's receipt.
        match (&self.edge, phase) {
            (Some((_, e)), Phase::AtRelay) => {
                phase.max(Phase::of_row(e.role, e.state, self.receipted))
            }
            _ => phase,
        }
    }

    /// The index, among the catalogues read, of the one that holds the row in charge.
    pub(super) fn catalog_index(&self) -> usize {
        let (catalog, _) = self.in_charge();
        index_of(self.catalogs, catalog)
    }

    /// When any of its rows last changed.
    pub(super) fn updated(&self) -> i64 {
        self.rows().map(|(_, r)| r.updated_at).max().unwrap_or(0)
    }

    pub(super) fn rows(&self) -> impl Iterator<Item = &(&'c Catalog, BatchRow)> {
        self.edge.iter().chain(self.core.iter())
    }
}

/// A batch's identity across catalogues: its site and its id. The id alone is not enough:
/// two sites sharing an edge key give a batch of the same name the same id.
pub(super) type JourneyKey = (String, String);

/// Every batch of `catalogs`, one journey each, by site and id; with `rows` read from each
/// catalogue (in the order of `catalogs`).
pub(super) fn journeys<'c>(
    catalogs: &'c [Catalog],
    rows: Vec<Vec<BatchRow>>,
) -> Result<BTreeMap<JourneyKey, Journey<'c>>> {
    let mut all: BTreeMap<JourneyKey, Journey<'c>> = BTreeMap::new();
    for (catalog, rows) in catalogs.iter().zip(rows) {
        let seals = Seals::read(catalog)?;
        for row in rows {
            let id = row.batch_key.batch().to_owned();
            let key = row.batch_key.to_string();
            let site = match row.role {
                Role::Edge => seals.site.get(&key).cloned().unwrap_or_default(),
                Role::Core => row.site.clone(),
            };
            let journey = all.entry((site.clone(), id)).or_insert_with(|| Journey {
                catalogs,
                edge: None,
                core: None,
                receipted: false,
                site,
            });
            match row.role {
                Role::Edge => {
                    journey.receipted |= seals.receipted.contains(&key);
                    journey.edge = Some((catalog, row));
                }
                Role::Core => journey.core = Some((catalog, row)),
            }
        }
    }
    // An edge row not sealed yet has no site: it stays a journey of its own, never merged
    // with a core row of the same id, which may be another site's (one edge key, one name).
    Ok(all)
}

/// The journey of the batch `key` (an edge's key, or a core's, `SITE/ID`) whose row is the one
/// in `catalogs[index]`: its rows in every catalogue, those of its site.
pub(super) fn journey_of<'c>(
    catalogs: &'c [Catalog],
    index: usize,
    key: &forte_catalog::BatchKey,
) -> Result<Option<Journey<'c>>> {
    // Its rows share its name (found through `batches_by_name`) and its id.
    let Some(row) = catalogs[index].batch(key)? else {
        return Ok(None);
    };
    let named = forte_catalog::Filter {
        batch: Some(row.name),
        ..forte_catalog::Filter::default()
    };
    let mut rows = vec![];
    for catalog in catalogs {
        let mut mine = catalog.batches_matching(&named)?;
        mine.retain(|r| r.batch_key.batch() == key.batch());
        rows.push(mine);
    }
    let wanted = key.to_string();
    let found = journeys(catalogs, rows)?.into_values();
    Ok(found.into_iter().find(|j| {
        j.rows()
            .any(|(c, r)| std::ptr::eq(*c, &catalogs[index]) && r.batch_key.to_string() == wanted)
    }))
}

/// The index of `catalog` among `catalogs` (0 if it is not one of them).
pub(super) fn index_of(catalogs: &[Catalog], catalog: &Catalog) -> usize {
    catalogs
        .iter()
        .position(|c| std::ptr::eq(c, catalog))
        .unwrap_or(0)
}

/// What an edge's seals say of its batches: the site each was sealed for, and which the core's
/// receipts (verified at the edge) cover.
struct Seals {
    site: HashMap<String, String>,
    receipted: HashSet<String>,
}

impl Seals {
    fn read(catalog: &Catalog) -> Result<Self> {
        let mut seals = Self {
            site: HashMap::new(),
            receipted: HashSet::new(),
        };
        for seal in catalog.edge_seals()? {
            if seal.receipted {
                seals.receipted.insert(seal.batch_key.clone());
            }
            seals.site.insert(seal.batch_key, seal.site);
        }
        Ok(seals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_moves_forward_through_the_phases_whichever_node_says_it() {
        use BatchState as S;
        let edge = |s| Phase::of_row(Role::Edge, s, false);
        let core = |s| Phase::of_row(Role::Core, s, false);
        let path = [
            edge(S::Queued),
            edge(S::Sending),
            edge(S::Sent),
            core(S::Queued),
            core(S::Pulling),
            core(S::Checking),
            core(S::Delivered),
        ];
        assert!(path.windows(2).all(|w| w[0] <= w[1]), "{path:?}");
        assert_eq!(Phase::of_row(Role::Edge, S::Sent, true), Phase::Delivered);
        assert_eq!(edge(S::SourceDeleted), Phase::Delivered);
        assert!(core(S::Quarantined).ended() && !core(S::Checking).ended());
    }

    fn record(catalog: &Catalog, key: &forte_catalog::BatchKey, state: BatchState) {
        let record = forte_catalog::BatchRecord {
            key,
            name: "run-4",
            files: 1,
            bytes: 10,
            state,
            arrived: None,
            detail: None,
        };
        catalog.batch_state(&record).unwrap();
        catalog.flush().unwrap();
    }

    /// Two sites share an edge key, so their batches of one name have one id. Site-a's was
    /// sealed and delivered; site-c's failed before it was sealed (so its row has no site).
    /// Site-c's is its own journey, failed: never merged into site-a's delivered one (found by
    /// the review of issue 46: it showed as "delivered, site-a").
    #[test]
    fn a_batch_not_sealed_is_never_merged_with_another_sites_of_the_same_id() {
        use forte_catalog::BatchKey;
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| Catalog::open(dir.path().join(name).to_str().unwrap()).unwrap();
        let catalogs = [
            open("edge-a.sqlite"),
            open("edge-c.sqlite"),
            open("core.sqlite"),
        ];
        let edge = BatchKey::edge("d5fb");
        record(&catalogs[0], &edge, BatchState::Sent);
        catalogs[0]
            .edge_instance(&edge, "site-a", "content", || "0".repeat(32))
            .unwrap();
        record(&catalogs[1], &edge, BatchState::Failed);
        record(
            &catalogs[2],
            &BatchKey::core("site-a", "d5fb"),
            BatchState::Delivered,
        );
        let rows = catalogs.iter().map(|c| c.batches().unwrap()).collect();
        let all = journeys(&catalogs, rows).unwrap();
        let phases: Vec<(&str, Phase, usize)> = all
            .iter()
            .map(|((site, _), j)| (site.as_str(), j.phase(), j.catalog_index()))
            .collect();
        assert_eq!(
            phases,
            [("", Phase::Failed, 1), ("site-a", Phase::Delivered, 2)],
            "{phases:?}"
        );
    }
}
