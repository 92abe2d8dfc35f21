//! `pull --dry-run`: what a pull would deliver, from the relay's sealed batches and their
//! verified inventories, and nothing else. Only read-only requests go to the relay (the ready
//! list, each inventory, one manifest per batch for its signed time); nothing is claimed,
//! downloaded, written, acknowledged or recorded.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use forte_daemon::settings::{Destination, PullSettings};
use serde::Serialize;

use forte_format::{Manifest, TrustedEdges};
use forte_relay::api::ReadyObject;
use forte_relay::client::RelayClient;

use crate::layout::{Fields, Layout};

/// The most bytes of an inventory and of a manifest read (as a pull reads them).
const MAX_INVENTORY_BYTES: u64 = 256 << 20;
const MAX_MANIFEST_BYTES: u64 = 128 << 20;

/// One sealed batch at the relay, as a pull would deliver it.
#[derive(Debug, Serialize)]
pub struct PlannedDelivery {
    pub site: String,
    /// Its name, as the edge signed it.
    pub batch: String,
    pub bytes: u64,
    pub files: Vec<PlannedFile>,
    /// Why it would not be delivered (an inventory that does not open or verify), if so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One file of a batch and where it would go.
#[derive(Debug, Serialize)]
pub struct PlannedFile {
    pub path: String,
    pub size: u64,
    /// Under the destination, by the layout (date fields: when the batch arrived at its edge,
    /// as signed; a pull's own).
    pub to: String,
}

/// Lists every sealed batch at the relay with its files and destination paths.
pub fn plan(settings: &PullSettings) -> Result<Vec<PlannedDelivery>> {
    let client = settings.relay.connect()?;
    let layout = Layout::parse(&settings.layout)?;
    let ready = client
        .ready(false)
        .context("listing the relay's sealed batches")?;
    let mut batches: BTreeMap<(String, String), Vec<&ReadyObject>> = BTreeMap::new();
    for object in &ready {
        let key = (object.site.clone(), object.batch.clone());
        batches.entry(key).or_default().push(object);
    }
    let trusted = settings.core.trusted.current();
    let root = match &settings.to {
        Destination::Dir(dir) => dir.display().to_string(),
        Destination::Bucket { url, .. } => url.clone(),
    };
    let mut planned = Vec::new();
    for ((site, id), objects) in batches {
        let bytes = objects
            .iter()
            .flat_map(|o| &o.parts)
            .map(|p| p.length)
            .sum();
        let opened = client
            .inventory(&site, &id, MAX_INVENTORY_BYTES)
            .map_err(anyhow::Error::from)
            .and_then(|sealed| sealed.context("the relay holds no inventory for it"))
            .and_then(|sealed: Vec<u8>| {
                forte_restore::open_inventory(&sealed, &settings.core.identities, &trusted)
            })
            .and_then(|inventory| {
                let time = batch_time(&client, settings, &trusted, &site, &objects)?;
                Ok((inventory, time))
            });
        let mut delivery = PlannedDelivery {
            site: site.clone(),
            batch: id.clone(),
            bytes,
            files: Vec::new(),
            error: None,
        };
        match opened {
            Ok((inventory, batch_time)) => {
                delivery.batch = inventory.batch.clone();
                for entry in &inventory.objects {
                    let to = layout.target(&Fields {
                        site: &site,
                        batch: &inventory.batch,
                        path: &entry.path,
                        batch_time,
                    });
                    let to = match to {
                        Ok(to) => to,
                        Err(e) => {
                            // As the pull would: the whole batch refused.
                            delivery.error = Some(format!("{e:#}"));
                            continue;
                        }
                    };
                    delivery.files.push(PlannedFile {
                        path: entry.path.clone(),
                        size: entry.size,
                        to: format!("{}/{to}", root.trim_end_matches('/')),
                    });
                }
                delivery.files.sort_by(|a, b| a.path.cmp(&b.path));
            }
            Err(e) => delivery.error = Some(format!("{e:#}")),
        }
        planned.push(delivery);
    }
    Ok(planned)
}

/// The time a pull files a batch under (`ahead.rs`, `stage`): the time it arrived at its
/// edge, as the edge signed it in its manifests (format 4; one manifest read, decrypted and
/// verified, as they all carry the batch's); for an older manifest, which names none, the
/// relay's earliest seal time of its objects. A manifest signed for another site than the
/// relay lists it under is refused, as the pull refuses it.
fn batch_time(
    client: &RelayClient,
    settings: &PullSettings,
    trusted: &TrustedEdges,
    site: &str,
    objects: &[&ReadyObject],
) -> Result<u64> {
    let relay_time = objects.iter().map(|o| o.sealed_at).min().unwrap_or(0);
    let Some(first) = objects.first() else {
        return Ok(relay_time);
    };
    let sealed = client.manifest(site, first.id, MAX_MANIFEST_BYTES)?;
    let identities = &settings.core.identities.0;
    let document = forte_format::seal::decrypt(identities, &sealed, MAX_MANIFEST_BYTES)
        .map_err(|e| anyhow::anyhow!("object {}: manifest.age: {e}", first.id))?;
    let manifest = Manifest::open(&document, trusted)
        .map_err(|e| anyhow::anyhow!("object {}: manifest {e}", first.id))?;
    match manifest.signed_origin() {
        Some((signed, _)) if signed != site => anyhow::bail!(
            "signed for site {signed:?}, but the relay lists it under site {site:?}: a pull would refuse it"
        ),
        Some((_, time)) => Ok(u64::try_from(time).unwrap_or(0)),
        None => Ok(relay_time),
    }
}

/// The plan as text: per batch its files and where each would go.
pub fn text(planned: &[PlannedDelivery]) -> String {
    let mut out = String::new();
    for d in planned {
        match &d.error {
            Some(e) => {
                out += &format!(
                    "batch {} of {}: would not be delivered: {e}\n",
                    d.batch, d.site
                )
            }
            None => {
                out += &format!(
                    "batch {} of {}: would deliver {} files ({} bytes sealed)\n",
                    d.batch,
                    d.site,
                    d.files.len(),
                    d.bytes
                );
                for f in &d.files {
                    out += &format!("  {} ({} bytes) -> {}\n", f.path, f.size, f.to);
                }
            }
        }
    }
    if planned.is_empty() {
        out += "nothing sealed waiting at the relay\n";
    }
    out += "dry run: nothing was claimed, downloaded, delivered, acknowledged or recorded\n";
    out
}
