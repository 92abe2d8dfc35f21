//! `pull --dry-run`: what a pull would deliver, from the relay's sealed batches and their
//! verified inventories, and nothing else. Only read-only requests go to the relay (the ready
//! list, each inventory); nothing is claimed, downloaded, written, acknowledged or recorded.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use forte_daemon::settings::{Destination, PullSettings};
use serde::Serialize;

use crate::layout::{Fields, Layout};

/// The most bytes of an inventory read (as a pull reads it).
const MAX_INVENTORY_BYTES: u64 = 256 << 20;

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
    /// Under the destination, by the layout (date fields from the batch's seal time).
    pub to: String,
}

/// Lists every sealed batch at the relay with its files and destination paths.
pub fn plan(settings: &PullSettings) -> Result<Vec<PlannedDelivery>> {
    let client = settings.relay.connect()?;
    let layout = Layout::parse(&settings.layout)?;
    let ready = client
        .ready(false)
        .context("listing the relay's sealed batches")?;
    let mut batches: BTreeMap<(String, String), u64> = BTreeMap::new();
    for object in &ready {
        let bytes: u64 = object.parts.iter().map(|p| p.length).sum();
        *batches
            .entry((object.site.clone(), object.batch.clone()))
            .or_default() += bytes;
    }
    let trusted = settings.core.trusted.current();
    let root = match &settings.to {
        Destination::Dir(dir) => dir.display().to_string(),
        Destination::Bucket { url, .. } => url.clone(),
    };
    let mut planned = Vec::new();
    for ((site, id), bytes) in batches {
        let opened = client
            .inventory(&site, &id, MAX_INVENTORY_BYTES)
            .map_err(anyhow::Error::from)
            .and_then(|sealed| sealed.context("the relay holds no inventory for it"))
            .and_then(|sealed: Vec<u8>| {
                forte_restore::open_inventory(&sealed, &settings.core.identities, &trusted)
            });
        let mut delivery = PlannedDelivery {
            site: site.clone(),
            batch: id.clone(),
            bytes,
            files: Vec::new(),
            error: None,
        };
        match opened {
            Ok(inventory) => {
                delivery.batch = inventory.batch.clone();
                let batch_time = (inventory.sealed_at.max(0) / 1_000_000) as u64;
                for entry in &inventory.objects {
                    let to = layout.render(&Fields {
                        site: &site,
                        batch: &inventory.batch,
                        path: &entry.path,
                        batch_time,
                    });
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
