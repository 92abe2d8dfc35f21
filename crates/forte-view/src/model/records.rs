//! Files, stages, failures, parts, events and usage as the API shows them; one batch whole and
//! one file's lineage over every catalogue.

use std::collections::HashMap;

use anyhow::Result;
use forte_catalog::{
    BatchKey, Catalog, Event, Failure, FileRow, FileState, PartRow, Stage, UsageRow,
};
use serde::Serialize;

use super::{Batch, Progress};

/// A file as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct File {
    pub object_id: String,
    pub batch_key: String,
    pub path: String,
    pub size: i64,
    pub state: FileState,
    pub sha256: Option<String>,
    pub delivered_to: Option<String>,
    pub carrier: Option<String>,
    pub updated_us: i64,
    /// Its parts done on its node so far (uploaded at the edge, verified at the core); counted
    /// in a batch's files only.
    pub parts_done: i64,
}

impl From<FileRow> for File {
    fn from(f: FileRow) -> Self {
        Self {
            object_id: f.object_id,
            batch_key: f.batch_key.to_string(),
            path: f.path,
            size: f.size,
            state: f.state,
            sha256: f.raw_sha256,
            delivered_to: f.delivered_to,
            carrier: f.carrier,
            updated_us: f.updated_at,
            parts_done: 0,
        }
    }
}

/// A stage of a batch on its node, from its start to its end.
#[derive(Debug, Clone, Serialize)]
pub struct StageSpan {
    pub stage: Stage,
    pub started_us: i64,
    pub ended_us: Option<i64>,
}

/// A failure as the API shows it: `GET /api/v1/failures`.
#[derive(Debug, Clone, Serialize)]
pub struct FailureView {
    pub at_us: i64,
    pub task: String,
    pub batch_key: String,
    pub object_id: Option<String>,
    pub part: Option<i64>,
    pub error: String,
}

impl From<Failure> for FailureView {
    fn from(f: Failure) -> Self {
        Self {
            at_us: f.at,
            task: f.task,
            batch_key: f.batch_key.to_string(),
            object_id: f.object_id,
            part: f.part,
            error: f.error,
        }
    }
}

/// A batch's files, each with its parts done.
fn files_with_progress(catalog: &Catalog, key: &BatchKey) -> Result<Vec<File>> {
    let done: HashMap<String, i64> = catalog
        .progress(key)?
        .into_iter()
        .map(|p| (p.object_id, p.parts_done))
        .collect();
    let files = catalog.files(key)?.into_iter().map(File::from);
    Ok(files
        .map(|f| File {
            parts_done: done.get(&f.object_id).copied().unwrap_or(0),
            ..f
        })
        .collect())
}

/// One batch, whole: `GET /api/v1/batches/{key}`.
#[derive(Debug, Clone, Serialize)]
pub struct BatchDetail {
    pub batch: Batch,
    pub stages: Vec<StageSpan>,
    pub files: Vec<File>,
    pub failures: Vec<FailureView>,
    /// The core's signed receipts for the batch's instances that this catalogue keeps.
    pub receipts: Vec<ReceiptView>,
}

/// A receipt the core signed for one instance of a batch (each seal of it: a follow-up is an
/// instance of its own), as kept in a catalogue.
#[derive(Debug, Clone, Serialize)]
pub struct ReceiptView {
    pub site: String,
    pub instance: String,
    pub sequence: i64,
    /// How it was checked before it was kept: at the edge, its signature against the trusted
    /// core keys (`--receipt-pub`) and its site against the edge's; at the core, signed there.
    pub verified: &'static str,
    pub outcome: Option<String>,
    pub files: Option<usize>,
    pub destination: Option<String>,
    pub delivered_us: Option<i64>,
    /// The signed document, as the core wrote it.
    pub document: String,
}

impl ReceiptView {
    fn of(row: forte_catalog::InstanceRow) -> Option<Self> {
        let document = row.receipt?;
        // The signed fields, wherever the envelope puts them (the object with `outcome`).
        let value: serde_json::Value = serde_json::from_str(&document).unwrap_or_default();
        let signed = find_object_with(&value, "outcome");
        let text = |field: &str| {
            signed
                .and_then(|o| o.get(field))
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        Some(Self {
            verified: match row.role {
                forte_catalog::Role::Edge => "verified at the edge with a trusted core key",
                forte_catalog::Role::Core => "signed by this core",
            },
            outcome: text("outcome"),
            files: signed
                .and_then(|o| o.get("files"))
                .and_then(|f| f.as_array())
                .map(Vec::len),
            destination: text("destination"),
            delivered_us: signed
                .and_then(|o| o.get("delivered_at"))
                .and_then(|v| v.as_i64()),
            site: row.site,
            instance: row.instance,
            sequence: row.sequence,
            document,
        })
    }
}

/// The first object in `value` (itself, or nested) that has `field`.
fn find_object_with<'v>(
    value: &'v serde_json::Value,
    field: &str,
) -> Option<&'v serde_json::Map<String, serde_json::Value>> {
    match value {
        serde_json::Value::Object(o) if o.contains_key(field) => Some(o),
        serde_json::Value::Object(o) => o.values().find_map(|v| find_object_with(v, field)),
        serde_json::Value::Array(a) => a.iter().find_map(|v| find_object_with(v, field)),
        _ => None,
    }
}

impl BatchDetail {
    pub fn read(catalog: &Catalog, key: &BatchKey, progress: &Progress) -> Result<Option<Self>> {
        let Some(row) = catalog.batch(key)? else {
            return Ok(None);
        };
        let stages = catalog.stages(key)?;
        let now = forte_catalog::now_us();
        let mut batch = Batch::with_stages(catalog, row, &stages, progress, now)?;
        progress.show_published(catalog, std::slice::from_mut(&mut batch), now)?;
        Ok(Some(Self {
            batch,
            stages: stages
                .into_iter()
                .map(|s| StageSpan {
                    stage: s.stage,
                    started_us: s.started_at,
                    ended_us: s.ended_at,
                })
                .collect(),
            files: files_with_progress(catalog, key)?,
            failures: catalog
                .failures(Some(key), 100)?
                .into_iter()
                .map(FailureView::from)
                .collect(),
            receipts: catalog
                .instances_of(key)?
                .into_iter()
                .filter_map(ReceiptView::of)
                .collect(),
        }))
    }
}

/// A part of a file as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PartView {
    pub index: i64,
    pub state: forte_catalog::PartState,
    pub raw_sha256: Option<String>,
    pub ciphertext_sha256: Option<String>,
}

/// A change of state a catalogue recorded, as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct EventView {
    pub at_us: i64,
    pub batch_key: String,
    pub object_id: Option<String>,
    pub part: Option<i64>,
    pub state: String,
    pub detail: Option<String>,
}

impl From<Event> for EventView {
    fn from(e: Event) -> Self {
        Self {
            at_us: e.at,
            batch_key: e.batch_key.to_string(),
            object_id: e.object_id,
            part: e.part,
            state: e.state,
            detail: e.detail,
        }
    }
}

impl From<PartRow> for PartView {
    fn from(p: PartRow) -> Self {
        Self {
            index: p.index,
            state: p.state,
            raw_sha256: p.raw_sha256,
            ciphertext_sha256: p.ciphertext_sha256,
        }
    }
}

/// A file's lineage over every catalogue: `GET /api/v1/files/{object_id}`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Lineage {
    pub files: Vec<File>,
    pub parts: Vec<PartView>,
    pub events: Vec<EventView>,
    /// The name of each batch the rows and events name, by batch key (keys are opaque ids).
    pub batch_names: std::collections::BTreeMap<String, String>,
}

impl Lineage {
    pub fn read(catalogs: &[Catalog], object_id: &str) -> Result<Self> {
        let mut lineage = Self::default();
        for catalog in catalogs {
            let rows = catalog.files_of_object(object_id)?;
            lineage.files.extend(rows.into_iter().map(File::from));
            lineage
                .parts
                .extend(catalog.parts(object_id)?.into_iter().map(PartView::from));
            lineage
                .events
                .extend(catalog.lineage(object_id)?.into_iter().map(EventView::from));
        }
        lineage.events.sort_by_key(|e| e.at_us);
        let keys: std::collections::BTreeSet<&String> = lineage
            .files
            .iter()
            .map(|f| &f.batch_key)
            .chain(lineage.events.iter().map(|e| &e.batch_key))
            .collect();
        for key in keys {
            let parsed = BatchKey::parse(key);
            for catalog in catalogs {
                if let Some(row) = catalog.batch(&parsed)?.filter(|r| !r.name.is_empty()) {
                    lineage.batch_names.insert(key.clone(), row.name);
                    break;
                }
            }
        }
        Ok(lineage)
    }

    /// The batch `key`'s name, where a catalogue knows it, else the key.
    pub fn batch_name<'a>(&'a self, key: &'a str) -> &'a str {
        self.batch_names.get(key).map_or(key, String::as_str)
    }
}

/// A utilisation sample as the API shows it: `GET /api/v1/usage`.
#[derive(Debug, Clone, Serialize)]
pub struct UsageView {
    pub node: String,
    pub at_us: i64,
    pub seconds: f64,
    pub cpu_percent: f64,
    pub memory_used: i64,
    pub own_cpu_percent: f64,
    pub own_memory: i64,
    pub disk_read_bps: f64,
    pub disk_write_bps: f64,
    pub net_rx_bps: f64,
    pub net_tx_bps: f64,
}

impl From<UsageRow> for UsageView {
    fn from(u: UsageRow) -> Self {
        Self {
            node: u.node,
            at_us: u.at,
            seconds: u.seconds,
            cpu_percent: u.cpu_percent,
            memory_used: u.memory_used,
            own_cpu_percent: u.own_cpu_percent,
            own_memory: u.own_memory,
            disk_read_bps: u.disk_read_bps,
            disk_write_bps: u.disk_write_bps,
            net_rx_bps: u.net_rx_bps,
            net_tx_bps: u.net_tx_bps,
        }
    }
}
