//! Where each thing the store keeps lives: the keys of the layout in the module's
//! documentation, and the part records (`part-N.sha256`: `SHA256 LENGTH`) read back.

use forte_format::{part_file_name, ObjectId};

use crate::api::PartRef;

/// The name of an object's sealed record, among its records.
pub(super) const SEALED_RECORD: &str = "sealed.json";

/// The part index a record's name (`part-N.sha256`) names.
pub(super) fn record_index(name: &str) -> Option<u32> {
    name.strip_prefix("part-")?
        .strip_suffix(".sha256")?
        .parse()
        .ok()
}

/// A part's record (`SHA256 LENGTH`), if it reads as one.
pub(super) fn part_record(index: u32, record: &[u8]) -> Option<PartRef> {
    let text = std::str::from_utf8(record).ok()?;
    let (sha256, length) = text.trim().split_once(' ')?;
    Some(PartRef {
        index,
        sha256: sha256.to_string(),
        length: length.parse().ok()?,
    })
}

fn record_name(index: u32) -> String {
    format!("part-{index:06}.sha256")
}

/// Where part `index` of an object is kept.
pub(super) fn part_key(site: &str, id: ObjectId, index: u32) -> String {
    format!("{}/{}", object_key(site, id), part_file_name(index))
}

/// Where the record of part `index` of an object is kept.
pub(super) fn record_key(site: &str, id: ObjectId, index: u32) -> String {
    format!("{}/{}", meta_key(site, id), record_name(index))
}

pub(super) fn site_key(site: &str) -> String {
    format!("sites/{site}")
}

pub(super) fn object_key(site: &str, id: ObjectId) -> String {
    format!("sites/{site}/objects/{id}")
}

pub(super) fn meta_key(site: &str, id: ObjectId) -> String {
    format!("sites/{site}/meta/{id}")
}

pub(super) fn sealed_key(site: &str, id: ObjectId) -> String {
    format!("sites/{site}/meta/{id}/{SEALED_RECORD}")
}

pub(super) fn acked_key(site: &str, id: ObjectId) -> String {
    format!("sites/{site}/acked/{id}")
}

pub(super) fn batch_key(site: &str, batch: &str) -> String {
    format!("sites/{site}/batches/{batch}.json")
}

pub(super) fn inventory_key(site: &str, batch: &str) -> String {
    format!("sites/{site}/batches/{batch}.inventory.age")
}

/// Where the core's receipts for a batch are kept: one per delivered instance, named by the
/// receipt's SHA-256, so a receipt given again (a replay acknowledged) is kept once.
pub(super) fn receipts_key(site: &str, batch: &str) -> String {
    format!("sites/{site}/receipts/{batch}")
}

pub(super) fn acking_key(site: &str, batch: &str) -> String {
    format!("sites/{site}/batches/{batch}.acking.json")
}
