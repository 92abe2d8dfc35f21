//! The site's edge tasks (`[[task]]` at = "edge") on a ready batch, before any of it is
//! prepared: a batch they refuse is recorded `refused` with the reason, reported, and left in
//! the inbox until its ready marker is touched (the data fixed, or the check changed).

use forte_catalog::{BatchKey, BatchState};
use forte_prepare::SourceFile;

use super::{Batch, Edge};
use forte_daemon::tasks::{self, Point, Subject, SubjectFile};

impl Edge<'_> {
    /// Runs the edge tasks on the batch `key`, `batch` (its files `files`), unless an earlier
    /// run already sent it (`state`); the refusals in words, `None` when it may go.
    pub(super) fn refused_at_edge(
        &self,
        key: &BatchKey,
        Batch { name, dir }: &Batch,
        files: &[SourceFile],
        state: Option<BatchState>,
    ) -> Option<String> {
        let run = self.setup.tasks.at(Point::Edge);
        let checked_before = matches!(
            state,
            Some(
                BatchState::Sending
                    | BatchState::Sent
                    | BatchState::SourceKept
                    | BatchState::SourceDeleted
            )
        );
        if run.is_empty() || checked_before {
            return None;
        }
        let files: Vec<SubjectFile> = files
            .iter()
            .filter(|f| f.kind == forte_format::Kind::File)
            .map(|f| SubjectFile {
                object_id: String::new(),
                path: f.path.clone(),
                under_dir: f.path.clone(),
                sha256: String::new(),
                size: f.size,
            })
            .collect();
        let subject = Subject {
            key,
            site: "",
            batch: name,
            at: Point::Edge,
            dir,
            files: &files,
            list: std::env::temp_dir().join(format!("forte-{}.files", key.batch())),
        };
        let refusals = tasks::check(&run, &subject, self.setup.catalog);
        if refusals.is_empty() {
            return None;
        }
        let reasons: Vec<String> = refusals.iter().map(ToString::to_string).collect();
        Some(format!(
            "not sent: {}; touch {}/{} to check and send it again",
            reasons.join("; "),
            dir.display(),
            super::READY_MARKER
        ))
    }
}
