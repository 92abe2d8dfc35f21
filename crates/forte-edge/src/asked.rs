//! What the relay held of a new batch before this run sent it: asked while the batch's first
//! uploads go (`admit`), awaited by its seal (`seal`). Apart from both, so that neither imports
//! the other.

use std::collections::HashSet;

use forte_relay::api::{ObjectState, ObjectStatus};
use parking_lot::{Condvar, Mutex};

/// What the relay held of a new batch's objects before this run sent them.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum HeldBefore {
    /// None of them sealed or delivered: the batch is sealed as sent.
    Nothing,
    /// Some sealed or delivered, by a run this catalogue has no record of: the batch is sent
    /// again, planned from what the relay holds.
    Some,
    /// The relay could not be asked: why. The batch fails; the next run asks first.
    Unknown(String),
}

/// The relay's answer for one new batch, awaited by its seal.
#[derive(Default)]
pub(super) struct Asked {
    answer: Mutex<Option<HeldBefore>>,
    answered: Condvar,
    /// The ciphertext SHA-256 of every part of the batch this run sent before the answer
    /// came, recorded before each request: an object the answer reports sealed with only these
    /// parts was sealed by this run (the query and the uploads cross together).
    sent: Mutex<HashSet<String>>,
}

impl Asked {
    /// A part about to be sent.
    pub(super) fn sending(&self, sha256: &str) {
        if self.answer.lock().is_none() {
            self.sent.lock().insert(sha256.to_owned());
        }
    }

    /// Whether the relay's `status` of an object shows it sealed or delivered before this
    /// run.
    pub(super) fn held_before(&self, status: &ObjectStatus) -> bool {
        match status.state {
            ObjectState::Open => false,
            ObjectState::Delivered => true,
            ObjectState::Complete => {
                let sent = self.sent.lock();
                !status.parts.iter().all(|p| sent.contains(&p.sha256))
            }
        }
    }

    pub(super) fn set(&self, held: HeldBefore) {
        self.answer.lock().get_or_insert(held);
        self.answered.notify_all();
    }

    /// The answer, if it came.
    pub(super) fn get(&self) -> Option<HeldBefore> {
        self.answer.lock().clone()
    }

    /// The answer, once it comes.
    pub(super) fn wait(&self) -> HeldBefore {
        let mut answer = self.answer.lock();
        loop {
            if let Some(held) = answer.as_ref() {
                return held.clone();
            }
            self.answered.wait(&mut answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forte_relay::api::PartRef;

    fn status(state: ObjectState, hashes: &[&str]) -> ObjectStatus {
        let parts = hashes.iter().enumerate();
        ObjectStatus {
            state,
            parts: parts
                .map(|(i, h)| PartRef {
                    index: i as u32,
                    sha256: h.to_string(),
                    length: 1,
                })
                .collect(),
        }
    }

    /// The status query crosses with the uploads: an object sealed from this run's parts
    /// is this run's, one sealed from other parts or delivered was there before; parts of an
    /// open object are replaced as they come.
    #[test]
    fn only_objects_sealed_from_other_parts_or_delivered_were_held_before() {
        let asked = Asked::default();
        asked.sending("ours-0");
        asked.sending("ours-1");
        let held = |state, hashes: &[&str]| asked.held_before(&status(state, hashes));
        assert!(!held(ObjectState::Complete, &["ours-0", "ours-1"]));
        assert!(held(ObjectState::Complete, &["ours-0", "earlier-1"]));
        assert!(held(ObjectState::Delivered, &[]));
        assert!(!held(ObjectState::Open, &["earlier-0"]));
        // Parts sent once the answer is in are not needed to read it.
        asked.set(HeldBefore::Nothing);
        asked.sending("later");
        assert!(held(ObjectState::Complete, &["later"]));
    }
}
