//! The sink of `forte send`: sealed parts and manifests go straight from the prepare pipeline to
//! the relay, over as many connections as the sink has workers. Nothing is spooled to disk.

use std::collections::BTreeMap;

use anyhow::Result;
use forte_format::{Manifest, ObjectId};
use forte_prepare::{HeldPart, Sink};
use forte_relay::api::{ObjectState, PartRef};
use forte_relay::client::RelayClient;

use super::retry::Retry;

pub struct UploadSink<'a> {
    pub client: &'a RelayClient,
    /// The opaque batch id the relay groups objects by.
    pub batch_id: String,
    pub retry: Retry,
}

impl Sink for UploadSink<'_> {
    fn put_part(&self, id: ObjectId, index: u32, sealed: &[u8], sha256: &str) -> Result<()> {
        let what = format!("upload of part {index} of object {id}");
        self.retry
            .run(&what, || self.client.put_part(id, index, sealed, sha256))?;
        Ok(())
    }

    fn put_manifest(&self, manifest: &Manifest, sealed: &[u8]) -> Result<()> {
        let parts: Vec<PartRef> = manifest
            .parts
            .iter()
            .map(|p| PartRef {
                index: p.index,
                sha256: p.ciphertext_sha256.clone(),
                length: p.ciphertext_length,
            })
            .collect();
        let what = format!("seal of object {} ({})", manifest.id, manifest.path);
        self.retry.run(&what, || {
            self.client
                .seal(manifest.id, &self.batch_id, parts.clone(), sealed)
        })?;
        Ok(())
    }

    fn abandon(&self, _id: ObjectId) {
        // Parts already at the relay stay there unsealed: the next run of send resumes them.
    }
}

/// What the relay already has of an object, for resuming.
pub enum AtRelay {
    /// Nothing: prepare and send everything.
    Nothing,
    /// Some parts: send the rest.
    Parts(BTreeMap<u32, HeldPart>),
    /// Sealed and waiting for pull, or already delivered: nothing to do.
    Done,
}

pub fn at_relay(client: &RelayClient, retry: &Retry, id: ObjectId) -> Result<AtRelay> {
    let status = retry.run(&format!("status of object {id}"), || client.status(id))?;
    Ok(match status {
        None => AtRelay::Nothing,
        Some(s) if s.state == ObjectState::Open => AtRelay::Parts(
            s.parts
                .into_iter()
                .map(|p| {
                    (
                        p.index,
                        HeldPart {
                            ciphertext_sha256: p.sha256,
                            ciphertext_length: p.length,
                        },
                    )
                })
                .collect(),
        ),
        Some(_) => AtRelay::Done,
    })
}
