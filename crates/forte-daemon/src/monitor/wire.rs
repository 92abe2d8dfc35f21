//! The edge's parts between prepare and the link, for the dashboard's wire view: what is
//! sealed and waiting, what is being sent and how far, and the compression estimated for the
//! batches still preparing. Fed by the edge's pipeline and upload as parts move.

use std::collections::HashMap;

use forte_catalog::BatchKey;
use forte_format::ObjectId;
use forte_prepare::Compressibility;
use forte_view::WireView;
use parking_lot::Mutex;

/// One part of one object.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct PartId {
    object: ObjectId,
    index: u32,
}

/// The edge's sealed bytes sent and ready for the link (kept once a part is prepared).
static WIRE: Mutex<Option<Wire>> = Mutex::new(None);

#[derive(Default)]
struct Wire {
    view: WireView,
    /// The parts prepared and not yet sent.
    waiting: HashMap<PartId, Waiting>,
    /// The place in the prepare order the next part prepared takes.
    next_seq: u64,
    /// Per running batch: its objects' estimated compressed bytes per raw byte.
    estimates: HashMap<String, HashMap<ObjectId, f64>>,
}

/// A part prepared and not yet sent.
struct Waiting {
    batch: String,
    /// Its place in the prepare order.
    seq: u64,
    raw: u64,
    sealed: u64,
    /// While it is being uploaded: the bytes its connection has taken.
    sending: Option<u64>,
}

impl Wire {
    /// Takes a waiting part out of its batch's waiting bytes.
    fn unwait(&mut self, part: PartId) {
        let Some(part) = self.waiting.remove(&part) else {
            return;
        };
        if let Some(batch) = self.view.batches.get_mut(&part.batch) {
            batch.waiting_raw = batch.waiting_raw.saturating_sub(part.raw);
        }
    }
}

/// Part `index` of object `id` of the edge's `batch` is sealed and waits for the link.
pub fn part_prepared(batch: &BatchKey, id: ObjectId, index: u32, raw: u64, sealed: u64) {
    let mut wire = WIRE.lock();
    let wire = wire.get_or_insert_with(Wire::default);
    // Prepared again (its file retried): counted once.
    wire.unwait(PartId { object: id, index });
    if wire.waiting.is_empty() {
        wire.view.resumed = Some((forte_catalog::now_us(), wire.view.sent));
    }
    let key = batch.to_string();
    let seq = wire.next_seq;
    wire.next_seq += 1;
    wire.view.prepared_raw += raw;
    wire.view.prepared_sealed += sealed;
    let estimate = wire
        .estimates
        .get(&key)
        .and_then(|objects| objects.get(&id))
        .map(|per_raw| (raw as f64 * per_raw) as u64);
    let mine = wire.view.batches.entry(key.clone()).or_default();
    mine.prepared_raw += raw;
    mine.prepared_sealed += sealed;
    mine.waiting_raw += raw;
    if let Some(estimate) = estimate {
        let left = &mut mine.estimated_left;
        *left = (left.0.saturating_sub(raw), left.1.saturating_sub(estimate));
        for prepared in [
            &mut mine.estimated_prepared,
            &mut wire.view.estimated_prepared,
        ] {
            *prepared = (prepared.0 + estimate, prepared.1 + sealed);
        }
    }
    wire.waiting.insert(
        PartId { object: id, index },
        Waiting {
            batch: key,
            seq,
            raw,
            sealed,
            sending: None,
        },
    );
}

/// The edge's `batch` will prepare `objects`, estimated to compress so (see
/// [`forte_prepare::probe`]).
pub fn batch_probed(batch: &BatchKey, objects: &[Compressibility]) {
    if objects.is_empty() {
        return;
    }
    let mut wire = WIRE.lock();
    let wire = wire.get_or_insert_with(Wire::default);
    let key = batch.to_string();
    let raw = objects.iter().map(|o| o.raw).sum();
    let estimate = objects
        .iter()
        .map(|o| o.raw as f64 * o.per_raw)
        .sum::<f64>();
    let mine = wire.view.batches.entry(key.clone()).or_default();
    mine.estimated_left = (raw, estimate as u64);
    let per_raw = objects.iter().map(|o| (o.id, o.per_raw)).collect();
    wire.estimates.insert(key, per_raw);
}

/// An attempt to upload part `index` of object `id` begins.
pub fn part_sending(id: ObjectId, index: u32) {
    let mut wire = WIRE.lock();
    let Some(wire) = wire.as_mut() else { return };
    if let Some(part) = wire.waiting.get_mut(&PartId { object: id, index }) {
        // A retried upload sends from the start again.
        part.sending = Some(0);
    }
}

/// The connection uploading part `index` of object `id` took `bytes` more of it (see
/// [`forte_relay::client::RelayClient::telling_sent`]).
pub fn part_sending_bytes(id: ObjectId, index: u32, bytes: u64) {
    let mut wire = WIRE.lock();
    let wire = wire.get_or_insert_with(Wire::default);
    wire.view.sent += bytes;
    if let Some(sending) = wire
        .waiting
        .get_mut(&PartId { object: id, index })
        .and_then(|part| part.sending.as_mut())
    {
        *sending += bytes;
    }
}

/// Part `index` of object `id` is at the relay.
pub fn part_sent(id: ObjectId, index: u32) {
    let mut wire = WIRE.lock();
    let wire = wire.get_or_insert_with(Wire::default);
    wire.unwait(PartId { object: id, index });
}

/// The edge's `batch` ended: it has nothing more for the link.
pub fn batch_ended(batch: &BatchKey) {
    if let Some(wire) = WIRE.lock().as_mut() {
        let key = batch.to_string();
        wire.view.batches.remove(&key);
        wire.estimates.remove(&key);
        wire.waiting.retain(|_, part| part.batch != key);
    }
}

/// The wire as the dashboard shows it now, waiting parts in prepare order; none before the
/// first part was prepared.
pub(super) fn view() -> Option<WireView> {
    let wire = WIRE.lock();
    let wire = wire.as_ref()?;
    let mut view = wire.view.clone();
    view.waiting = wire
        .waiting
        .values()
        .map(|part| forte_view::WaitingPart {
            batch: part.batch.clone(),
            seq: part.seq,
            sealed: part.sealed,
            sending: part.sending,
        })
        .collect();
    view.waiting.sort_by_key(|part| part.seq);
    Some(view)
}
