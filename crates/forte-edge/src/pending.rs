//! The edge's batches that a watching sender's passes still have work on (sent and not yet
//! deleted: lost ones to find, acknowledged ones to delete), kept current from the catalogue
//! by what changed since the last look. A pass reads the last minute's changes through an
//! index, not a year of batches.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use forte_catalog::{BatchKey, BatchRow, BatchState, Catalog, Role};

/// The states a pass has work on.
const PENDING: [BatchState; 2] = [BatchState::Sent, BatchState::SourceKept];

/// How far before the last look a look reads again: a change stamped just before that look
/// may be committed after it (a thread that took its time, then waited for the writer).
const OVERLAP_US: i64 = 60_000_000;

/// How often every pending batch is read again whatever the stamps say: a clock stepped back
/// stamps changes before the last look, and this bounds how long one goes unseen.
const FULL_LOOK_EVERY: Duration = Duration::from_secs(15 * 60);

/// The pending batches as of the last look.
#[derive(Default)]
pub(crate) struct Pending {
    batches: HashMap<BatchKey, BatchRow>,
    /// When the last look started (µs, the catalogue's clock) and when the last full one did.
    looked_at: Option<(i64, Instant)>,
}

impl Pending {
    /// The edge's batches sent or with their sources kept, oldest first, as the catalogue
    /// says now.
    pub(crate) fn current(&mut self, catalog: &Catalog) -> Result<Vec<BatchRow>> {
        let now = forte_catalog::now_us();
        match self.looked_at {
            Some((last, full)) if full.elapsed() < FULL_LOOK_EVERY => {
                for b in catalog.batches_updated_since(last - OVERLAP_US)? {
                    if b.role == Role::Edge && PENDING.contains(&b.state) {
                        self.batches.insert(b.batch_key.clone(), b);
                    } else {
                        self.batches.remove(&b.batch_key);
                    }
                }
                self.looked_at = Some((now, full));
            }
            _ => {
                self.batches = catalog
                    .batches_in(&PENDING)?
                    .into_iter()
                    .filter(|b| b.role == Role::Edge)
                    .map(|b| (b.batch_key.clone(), b))
                    .collect();
                self.looked_at = Some((now, Instant::now()));
            }
        }
        let mut batches: Vec<BatchRow> = self.batches.values().cloned().collect();
        batches.sort_by(|a, b| (a.created_at, &a.batch_key).cmp(&(b.created_at, &b.batch_key)));
        Ok(batches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forte_catalog::BatchRecord;

    fn record(catalog: &Catalog, key: &BatchKey, state: BatchState) {
        let record = BatchRecord {
            key,
            name: key.batch(),
            files: 1,
            bytes: 1,
            state,
            arrived: None,
            detail: None,
        };
        catalog.batch_state(&record).unwrap();
    }

    fn names(batches: &[BatchRow]) -> Vec<&str> {
        batches.iter().map(|b| b.name.as_str()).collect()
    }

    /// What the first look finds, later looks follow: a batch sent since appears, one whose
    /// source went leaves, one kept stays; the core's batches never count.
    #[test]
    fn later_looks_follow_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("edge.sqlite").to_str().unwrap()).unwrap();
        let (old, kept, new) = (
            BatchKey::edge("old"),
            BatchKey::edge("kept"),
            BatchKey::edge("new"),
        );
        record(&catalog, &old, BatchState::Sent);
        record(&catalog, &kept, BatchState::SourceKept);
        record(&catalog, &BatchKey::core("s", "at-core"), BatchState::Sent);
        record(&catalog, &BatchKey::edge("gone"), BatchState::SourceDeleted);
        let mut pending = Pending::default();
        assert_eq!(names(&pending.current(&catalog).unwrap()), ["old", "kept"]);

        record(&catalog, &new, BatchState::Sending);
        record(&catalog, &new, BatchState::Sent);
        record(&catalog, &old, BatchState::SourceDeleted);
        assert_eq!(names(&pending.current(&catalog).unwrap()), ["kept", "new"]);
        // A look after the overlap has passed reads nothing old again, and loses nothing.
        pending.looked_at = pending
            .looked_at
            .map(|(at, full)| (at + 2 * OVERLAP_US, full));
        assert_eq!(names(&pending.current(&catalog).unwrap()), ["kept", "new"]);
    }
}
