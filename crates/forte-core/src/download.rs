//! The source of `forte pull`: one batch's objects, read from the relay.

use anyhow::Result;
use forte_catalog::{BatchKey, Task};
use forte_relay::api::ReadyObject;
use forte_relay::client::RelayClient;
use forte_restore::{ObjectRef, ObjectSource, PartError};

use forte_daemon::record::{attempt, Catalog};
use forte_daemon::retry::{Operation, Retry};

pub struct RelaySource<'a> {
    pub client: &'a RelayClient,
    pub retry: Retry,
    /// Where each download attempt is recorded, under this batch key.
    pub catalog: &'a Catalog,
    pub batch_key: &'a BatchKey,
    /// The objects of one batch, as the relay listed them.
    pub objects: Vec<ReadyObject>,
}

impl RelaySource<'_> {
    fn site(&self, object: &ObjectRef) -> &str {
        self.objects
            .iter()
            .find(|o| o.id == object.id)
            .map_or("", |o| o.site.as_str())
    }
}

impl ObjectSource for RelaySource<'_> {
    fn list(&self) -> Result<Vec<ObjectRef>> {
        Ok(self
            .objects
            .iter()
            .map(|o| ObjectRef {
                id: o.id,
                place: format!("relay site {}", o.site),
            })
            .collect())
    }

    fn inventory(&self, max_len: u64) -> Result<Option<Vec<u8>>> {
        let Some(first) = self.objects.first() else {
            return Ok(None);
        };
        let what = format!("download of the inventory of batch {}", first.batch);
        let sealed = self.retry.run(Operation::Download, &what, || {
            self.client.inventory(&first.site, &first.batch, max_len)
        })?;
        if let Some(bytes) = &sealed {
            anyhow::ensure!(
                bytes.len() as u64 <= max_len,
                "inventory of more than {max_len} bytes is too large"
            );
        }
        Ok(sealed)
    }

    fn manifest(&self, object: &ObjectRef, max_len: u64) -> Result<Vec<u8>> {
        let site = self.site(object);
        let what = format!("download of the manifest of object {}", object.id);
        let bytes = self.retry.run(Operation::Download, &what, || {
            attempt(
                self.catalog,
                Task::Download,
                self.batch_key,
                object.id,
                None,
                || self.client.manifest(site, object.id, max_len),
            )
        })?;
        anyhow::ensure!(
            bytes.len() as u64 <= max_len,
            "manifest of more than {max_len} bytes is too large"
        );
        Ok(bytes)
    }

    fn part(&self, object: &ObjectRef, index: u32, length: u64) -> Result<Vec<u8>, PartError> {
        let site = self.site(object);
        let what = format!("download of part {index} of object {}", object.id);
        let bytes = self
            .retry
            .run(Operation::Download, &what, || {
                attempt(
                    self.catalog,
                    Task::Download,
                    self.batch_key,
                    object.id,
                    Some(index),
                    || self.client.part(site, object.id, index, length),
                )
            })
            .map_err(|e| PartError::Unavailable(e.to_string()))?;
        // Read no further than one byte past the manifest's length: a longer copy is damaged
        // whatever its size.
        if bytes.len() as u64 != length {
            let has = if bytes.len() as u64 > length {
                "more than".to_string()
            } else {
                bytes.len().to_string()
            };
            return Err(PartError::Damaged(format!(
                "the relay's copy has {has} bytes, the manifest says {length}"
            )));
        }
        Ok(bytes)
    }
}
