//! The catalogue's vocabulary as types: which end recorded a batch, the states batches, files
//! and parts go through, the stages and tasks that are timed, and a batch's key. Each value maps
//! to the text stored in the database in one place (`as_str`, and `parse` for reading it
//! back), so a misspelt state fails to compile instead of giving an empty report.

use std::fmt;

/// Defines a vocabulary: an enum, the text each value is stored as, and the texts older
/// versions stored for it (accepted when reading).
macro_rules! vocabulary {
    (
        $(#[$doc:meta])*
        $name:ident {
            $($(#[$value_doc:meta])* $value:ident = $text:literal $(| $older:literal)*,)+
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$value_doc])* $value,)+
        }

        impl $name {
            /// The text stored in the catalogue.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$value => $text,)+
                }
            }

            /// The value stored as `text`, by this version or an older one.
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text $(| $older)* => Some(Self::$value),)+
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}

vocabulary! {
    /// Which end of the path a batch row, a metric or a utilisation sample belongs to.
    Role {
        Edge = "edge",
        Core = "core",
    }
}

vocabulary! {
    /// The states a batch goes through on its node, in order: at the edge queued, sending,
    /// sent, source deleted; at the core pulling, delivered. Recorded only forwards (the same
    /// state again refreshes the batch's totals, nothing else). Failed, cancelled and source
    /// kept are set-backs that a retry's states may follow (a failed send is sent again, a
    /// cancelled batch whose ready marker is touched is queued again, a file that appears in a
    /// batch whose sendable files were all deleted is sent as a follow-up); they are not
    /// recorded over a batch that is finished for good (delivered at the core, its source
    /// deleted at the edge).
    BatchState {
        Queued = "queued",
        Pulling = "pulling",
        Sending = "sending",
        /// At the core: verified and in the landing zone, the site's tasks checking it.
        Checking = "checking",
        Sent = "sent",
        Delivered = "delivered" | "acknowledged",
        /// At the core: verified, and held back in quarantine because a task refused it.
        Quarantined = "quarantined",
        SourceDeleted = "source_deleted",
        /// Some files stay at the source: refused, failed, changed or late.
        SourceKept = "source_kept",
        Failed = "failed",
        Cancelled = "cancelled",
        /// At the edge: a site task refused it; not sent until its ready marker is touched.
        Refused = "refused",
    }
}

impl BatchState {
    /// The state's step in the order; `None` for a set-back.
    fn step(self) -> Option<u8> {
        Some(match self {
            Self::Queued | Self::Pulling => 0,
            Self::Sending | Self::Checking => 1,
            Self::Sent => 2,
            Self::Delivered | Self::Quarantined => 3,
            Self::SourceDeleted => 4,
            Self::SourceKept | Self::Failed | Self::Cancelled | Self::Refused => return None,
        })
    }

    /// Whether a batch in state `self` may be recorded as `next`.
    pub fn may_become(self, next: Self) -> bool {
        match (self.step(), next.step()) {
            (Some(was), Some(next)) => next >= was,
            (Some(_), None) => !matches!(
                self,
                Self::Delivered | Self::Quarantined | Self::SourceDeleted
            ),
            (None, _) => true,
        }
    }
}

vocabulary! {
    /// The states a file goes through, in order. The catalogue records a file's state only
    /// forwards: a state ranked below the file's current one (a later run discovering again a
    /// file that an earlier run sent, or the core acknowledged) leaves the row and its lineage
    /// as they are. Failed and damaged are set-backs, not steps: recorded while the file is not
    /// yet delivered (any state may then follow them, a retry starting over), and never after.
    FileState {
        Discovered = "discovered",
        /// At the relay: uploaded, or found there by a later run.
        AtRelay = "at_relay" | "uploaded",
        Sealed = "sealed",
        Verified = "verified",
        Delivered = "delivered",
        Acknowledged = "acknowledged",
        /// A delivered file's later version (a newer instance of its batch) took its place at
        /// the destination; its bytes are kept aside, as its event's detail says where.
        Replaced = "replaced",
        Failed = "failed",
        /// A part of it arrived damaged at the core.
        Damaged = "damaged",
        /// Left out by the edge's filter (`send --exclude` …), with the rule or bound that
        /// did in its event's detail: never sent, never deleted.
        Excluded = "excluded",
    }
}

impl FileState {
    /// The state's step in the order; `None` for a set-back.
    fn step(self) -> Option<u8> {
        Some(match self {
            // Beside discovered: a later run without the filter may send it, and a file sent
            // before is not recorded excluded after it.
            Self::Discovered | Self::Excluded => 0,
            Self::AtRelay => 1,
            Self::Sealed => 2,
            Self::Verified => 3,
            Self::Delivered => 4,
            Self::Acknowledged => 5,
            Self::Replaced => 6,
            Self::Failed | Self::Damaged => return None,
        })
    }

    /// Whether a file in state `self` may be recorded as `next`.
    pub fn may_become(self, next: Self) -> bool {
        match (self.step(), next.step()) {
            (Some(was), Some(next)) => next >= was,
            (Some(was), None) => was < 4,
            (None, _) => true,
        }
    }
}

vocabulary! {
    /// The states of one part of a file.
    PartState {
        /// Cut, sealed and on its way to the relay, which may hold it from now on: recorded
        /// (with its ciphertext hash and the part size its object was cut at) before the
        /// upload starts, so that a run killed meanwhile knows what the relay may hold.
        Sending = "sending",
        /// Accepted by the relay, its hash checked there.
        Uploaded = "uploaded",
        /// Listed in its file's manifest at the relay.
        Sealed = "sealed",
        /// Checked at the core against the signed manifest.
        Verified = "verified",
        Failed = "failed",
        Damaged = "damaged",
    }
}

vocabulary! {
    /// The timed stages of a batch (`stages` table): one per end.
    Stage {
        Send = "send",
        Pull = "pull",
    }
}

vocabulary! {
    /// How one try of a site's own task ended (`task_runs` table).
    TaskOutcome {
        /// Exit status 0.
        Passed = "passed",
        /// Exit status 1: the data fails the check. Not tried again.
        Refused = "refused",
        /// Any other exit, a signal, or the command could not start: tried again.
        Crashed = "crashed",
        /// Killed at its timeout: tried again.
        TimedOut = "timed_out",
        /// Passed, but the landed batch it ran on no longer matched what the core verified (a
        /// file changed, removed or added): the batch is quarantined, never promoted.
        Changed = "changed",
    }
}

vocabulary! {
    /// The tasks whose every try is recorded (`attempts` table).
    Task {
        Upload = "upload",
        Seal = "seal",
        Download = "download",
    }
}

/// A batch's key in the catalogue. The edge keys a batch by its id (derived from the edge's key
/// and the batch's name); the core by its site and that id, since the batches of every site
/// meet there. In a catalogue shared by both ends the two rows of one batch are distinct and
/// share the id. Stored as `id` and `site/id` (sites and ids never contain a slash).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BatchKey {
    Edge { batch: String },
    Core { site: String, batch: String },
}

impl BatchKey {
    pub fn edge(batch: impl Into<String>) -> Self {
        Self::Edge {
            batch: batch.into(),
        }
    }

    pub fn core(site: impl Into<String>, batch: impl Into<String>) -> Self {
        Self::Core {
            site: site.into(),
            batch: batch.into(),
        }
    }

    /// The end that keys batches this way.
    pub fn role(&self) -> Role {
        match self {
            Self::Edge { .. } => Role::Edge,
            Self::Core { .. } => Role::Core,
        }
    }

    /// The batch's id, the same at both ends.
    pub fn batch(&self) -> &str {
        match self {
            Self::Edge { batch } | Self::Core { batch, .. } => batch,
        }
    }

    /// The site, at the core; empty at the edge (which is one site).
    pub fn site(&self) -> &str {
        match self {
            Self::Edge { .. } => "",
            Self::Core { site, .. } => site,
        }
    }

    /// The key stored as `text`.
    pub fn parse(text: &str) -> Self {
        match text.split_once('/') {
            Some((site, batch)) => Self::core(site, batch),
            None => Self::edge(text),
        }
    }
}

impl fmt::Display for BatchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Edge { batch } => f.write_str(batch),
            Self::Core { site, batch } => write!(f, "{site}/{batch}"),
        }
    }
}

impl serde::Serialize for BatchKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stored_as_id_or_site_and_id_and_read_back() {
        for key in [BatchKey::edge("0a1b"), BatchKey::core("site-a", "0a1b")] {
            assert_eq!(BatchKey::parse(&key.to_string()), key);
        }
        assert_eq!(BatchKey::core("site-a", "0a1b").to_string(), "site-a/0a1b");
        assert_eq!(BatchKey::parse("0a1b").role(), Role::Edge);
        assert_eq!(BatchKey::parse("s/0a1b").batch(), "0a1b");
    }

    #[test]
    fn older_spellings_are_read_as_todays_states() {
        assert_eq!(FileState::parse("uploaded"), Some(FileState::AtRelay));
        assert_eq!(
            BatchState::parse("acknowledged"),
            Some(BatchState::Delivered)
        );
        assert_eq!(FileState::AtRelay.as_str(), "at_relay");
        assert_eq!(BatchState::parse("no such state"), None);
    }
}
