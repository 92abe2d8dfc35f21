//! The edge's uploads sharing the link: the sealed bytes that leave before a batch is done.

use std::collections::VecDeque;

use crate::live::{WaitingPart, WireView};

/// The edge's parts waiting for the link at a look, in the order the uploads take them: those
/// under way first, then the others in the order they were prepared.
pub(super) struct Uploads<'w> {
    parts: Vec<WaitingLeft<'w>>,
    /// Uploads under way (at least one): how many parts share the link at once.
    slots: usize,
    /// The mean sealed bytes of a waiting part: the size of the parts to come.
    part: f64,
}

/// A part waiting for the link: its batch and its sealed bytes left (of an upload under way,
/// those its connection has not taken yet).
struct WaitingLeft<'w> {
    batch: &'w str,
    left: f64,
}

impl<'w> Uploads<'w> {
    pub(super) fn of(wire: &'w WireView) -> Self {
        let left = |p: &'w WaitingPart| {
            let sent = p.sending.unwrap_or(0).min(p.sealed);
            WaitingLeft {
                batch: p.batch.as_str(),
                left: (p.sealed - sent) as f64,
            }
        };
        let (sending, queued): (Vec<_>, Vec<_>) =
            wire.waiting.iter().partition(|p| p.sending.is_some());
        let slots = sending.len().max(1);
        let waiting = wire.waiting.len().max(1) as f64;
        Self {
            parts: sending.into_iter().chain(queued).map(left).collect(),
            slots,
            part: wire.waiting.iter().map(|p| p.sealed as f64).sum::<f64>() / waiting,
        }
    }
}

/// Where a batch stands in what the edge has still to prepare, in sealed bytes.
pub(super) struct StillToPrepare {
    /// Whether the batch has parts still to prepare (or has prepared none).
    pub(super) preparing: bool,
    /// What the batches served before it have still to prepare, and it.
    pub(super) ahead: f64,
    /// What the edge has still to prepare, all told.
    pub(super) all: f64,
}

/// The sealed bytes that leave the edge before batch `key` is done (its time, at the node's
/// rate), given where it stands in what the edge has still to prepare.
/// The uploads take the parts in their order, as many at once as are under way now, and
/// share the link evenly. A batch with parts still to prepare is done once every part waiting
/// now has gone, and the unprepared bytes of the batches served before it and its own, and
/// what its last part shares the link with while it is sent ([`beside_a_part`]), at most what
/// the batches served after it have still to prepare. One prepared whole is done when the last
/// of its parts waiting now is sent, worked out part by part ([`link_bytes_until_sent`]); as
/// slots free up, parts of what the edge has still to prepare take them, as large as those
/// waiting now.
pub(super) fn sealed_before(
    key: &str,
    uploads: &Uploads,
    StillToPrepare {
        preparing,
        ahead,
        all,
    }: StillToPrepare,
) -> f64 {
    if preparing {
        let waiting: f64 = uploads.parts.iter().map(|p| p.left).sum();
        let after = (all - ahead).max(0.0);
        return waiting + ahead + beside_a_part(uploads.slots, uploads.part).min(after);
    }
    let parts = uploads.parts.iter().map(|p| Part {
        marked: p.batch == key,
        left: p.left,
    });
    let to_come = PartsToCome {
        bytes: all,
        size: uploads.part,
    };
    link_bytes_until_sent(parts, uploads.slots, to_come)
}

/// The bytes that parts taken after one of `size` get while it is sent, `slots` uploads
/// sharing the link evenly, all of them full: in the time it gets its bytes each slot gets as
/// many, `slots` × `size` in all, of which the parts under way when it began had half a part
/// each left on average (they began at random moments of their own sending). So a part sent
/// beside seven others takes the link for 3.5 parts' worth beyond its own and those before it:
/// counted alone, the last parts of a batch still being prepared read 20-28 % short at 8
/// uploads at once (docs/benchmarks/log/2026-11.md).
fn beside_a_part(slots: usize, size: f64) -> f64 {
    slots.saturating_sub(1) as f64 / 2.0 * size
}

/// A part on its way to the link.
struct Part {
    /// Whether it is one of those whose end is awaited.
    marked: bool,
    /// Its sealed bytes left.
    left: f64,
}

/// The parts that take the uploads' slots once every part waiting now is taken: what the edge
/// has still to prepare, in parts as large as those waiting.
struct PartsToCome {
    /// Their sealed bytes, all told.
    bytes: f64,
    /// The sealed bytes of one.
    size: f64,
}

/// The link's bytes that pass until the last of the `parts` marked is sent, `parts` taken in
/// their order, `slots` at a time, each of those under way getting an even share of the link,
/// and once they are all taken, parts to come in the slots that free up. Shared so, a part takes longer
/// than its own bytes at the link's rate: the parts beside it take their share (at 5 MB/s, a
/// 4-MB part started beside seven others as large is sent 6.4 s later, not 0.8 s).
fn link_bytes_until_sent(
    parts: impl Iterator<Item = Part>,
    slots: usize,
    PartsToCome {
        bytes: mut more,
        size,
    }: PartsToCome,
) -> f64 {
    let mut queued: VecDeque<Part> = parts.collect();
    let mut marked = queued.iter().filter(|p| p.marked).count();
    let mut under_way: Vec<Part> = Vec::with_capacity(slots);
    let mut passed = 0.0;
    while marked > 0 {
        while under_way.len() < slots {
            match queued.pop_front() {
                Some(part) => under_way.push(part),
                None if more > 0.0 && size > 0.0 => {
                    under_way.push(Part {
                        marked: false,
                        left: size.min(more),
                    });
                    more -= size;
                }
                None => break,
            }
        }
        // The part with the fewest bytes left ends first; until then each got as many.
        let fewest =
            (0..under_way.len()).min_by(|&a, &b| under_way[a].left.total_cmp(&under_way[b].left));
        let Some(first) = fewest else { break };
        let ended = under_way.swap_remove(first);
        passed += ended.left * (under_way.len() + 1) as f64;
        for part in &mut under_way {
            part.left -= ended.left;
        }
        marked -= usize::from(ended.marked);
    }
    passed
}
