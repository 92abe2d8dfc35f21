//! The memory that request bodies held whole take: a JSON body while it is parsed (a seal, a
//! batch's inventory, an acknowledgement), a one-part object's manifest. Each route bounds its
//! own body (`api::MAX_*`); this bounds them together, so that many large seals at once, from
//! one site's token or several, cannot exhaust the relay's memory. A body that could never fit
//! is refused from its declared length before a byte of it is read; the others take the budget
//! as their bytes arrive ([`MeteredBody`]), so that a client sending slowly holds only what it
//! sent, and a body that finds no room within [`WAIT_FOR_ROOM`] is told to retry (503). One
//! token's requests together hold at most [`PER_HOLDER`]. Part bodies take none of it (they go
//! to disk as they arrive), nor does the part in front of a one-part object's manifest.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use http_body::{Frame, SizeHint};
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::MAX_BATCH_SEAL_JSON;

/// What one token's requests may hold at once: the largest body a route takes.
pub const PER_HOLDER: u64 = MAX_BATCH_SEAL_JSON as u64;

/// The default budget for every request together.
pub const DEFAULT_BUDGET: u64 = 512 << 20;

/// How long a body waits for room before it is told to retry (503).
const WAIT_FOR_ROOM: Duration = Duration::from_secs(30);

/// The budget is counted in units of this many bytes (a semaphore's permits are `u32`).
const UNIT: u64 = 1 << 10;

/// The relay's budget for bodies held whole.
pub struct BodyMemory {
    budget: u64,
    room: Arc<Semaphore>,
    by_holder: Arc<Mutex<HashMap<String, u64>>>,
}

/// Why a body could never be held: retrying cannot help (413).
#[derive(Debug, PartialEq, Eq)]
pub struct TooLarge(pub String);

impl BodyMemory {
    pub fn new(budget: u64) -> Self {
        let units = budget.div_ceil(UNIT).min(u64::from(u32::MAX)) as usize;
        Self {
            budget,
            room: Arc::new(Semaphore::new(units)),
            by_holder: Arc::default(),
        }
    }

    /// A meter for a body of `declared` bytes from `holder` (its token's site or role), whose
    /// first `free` bytes are not held in memory; refused at once if the rest could never fit.
    pub fn meter(&self, holder: &str, declared: u64, free: u64) -> Result<Meter, TooLarge> {
        let held = declared.saturating_sub(free);
        if held > self.budget {
            return Err(TooLarge(format!(
                "a body of {held} bytes does not fit in the relay's memory for request bodies ({} bytes, relay --body-memory)",
                self.budget
            )));
        }
        if held > PER_HOLDER {
            return Err(TooLarge(format!(
                "a body of {held} bytes is more than one token may send at once ({PER_HOLDER})"
            )));
        }
        Ok(Meter {
            room: self.room.clone(),
            by_holder: self.by_holder.clone(),
            holder: holder.to_string(),
            free,
            seen: 0,
            held: 0,
            permits: Vec::new(),
            waiting: None,
            refused: Arc::default(),
        })
    }
}

type WaitForRoom = Pin<
    Box<
        dyn Future<
                Output = Result<
                    Result<OwnedSemaphorePermit, tokio::sync::AcquireError>,
                    tokio::time::error::Elapsed,
                >,
            > + Send,
    >,
>;

/// The part of the budget one body holds, taken as its bytes arrive and given back when it is
/// dropped (the request answered).
pub struct Meter {
    room: Arc<Semaphore>,
    by_holder: Arc<Mutex<HashMap<String, u64>>>,
    holder: String,
    free: u64,
    /// Bytes of the body seen so far, free ones included.
    seen: u64,
    /// Bytes held (counted against the holder and the budget).
    held: u64,
    permits: Vec<OwnedSemaphorePermit>,
    waiting: Option<WaitForRoom>,
    refused: Arc<Mutex<Option<String>>>,
}

impl Meter {
    /// Why the body ran out of room, once it did: what the request is answered (503).
    pub fn refused(&self) -> Arc<Mutex<Option<String>>> {
        self.refused.clone()
    }

    /// Takes room for `len` more bytes of the body, beyond the free ones.
    fn poll_take(&mut self, cx: &mut Context<'_>, len: u64) -> Poll<Result<(), String>> {
        if self.waiting.is_none() {
            let start = self.seen.max(self.free);
            self.seen += len;
            let bytes = self.seen.saturating_sub(start);
            if bytes == 0 {
                return Poll::Ready(Ok(()));
            }
            {
                let mut by_holder = self.by_holder.lock();
                let held = by_holder.entry(self.holder.clone()).or_default();
                if *held + bytes > PER_HOLDER {
                    return Poll::Ready(Err(format!(
                        "{} has {} bytes of request bodies in the relay's memory; {bytes} more exceed the {PER_HOLDER} one token may hold: retry",
                        self.holder, *held
                    )));
                }
                *held += bytes;
            }
            // Whole units for everything held so far: small frames are not rounded up each.
            let units = ((self.held + bytes).div_ceil(UNIT) - self.held.div_ceil(UNIT)) as u32;
            self.held += bytes;
            if units == 0 {
                return Poll::Ready(Ok(()));
            }
            match self.room.clone().try_acquire_many_owned(units) {
                Ok(permit) => {
                    self.permits.push(permit);
                    return Poll::Ready(Ok(()));
                }
                Err(_) => {
                    let wait = self.room.clone().acquire_many_owned(units);
                    self.waiting = Some(Box::pin(tokio::time::timeout(WAIT_FOR_ROOM, wait)));
                }
            }
        }
        let waiting = self.waiting.as_mut().expect("set above");
        let waited = ready!(waiting.as_mut().poll(cx));
        self.waiting = None;
        match waited {
            Ok(Ok(permit)) => {
                self.permits.push(permit);
                Poll::Ready(Ok(()))
            }
            _ => Poll::Ready(Err(
                "the relay holds as many request bodies in memory as it may (relay --body-memory): retry"
                    .to_string(),
            )),
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        let mut by_holder = self.by_holder.lock();
        if let Some(held) = by_holder.get_mut(&self.holder) {
            *held -= self.held.min(*held);
            if *held == 0 {
                by_holder.remove(&self.holder);
            }
        }
    }
}

/// A request body whose bytes take room in the budget as they arrive; a frame waits for room,
/// and the body fails (the request is answered 503) when none comes in time.
pub struct MeteredBody {
    inner: Body,
    meter: Meter,
    /// A frame read, waiting for room.
    pending: Option<Frame<Bytes>>,
}

impl MeteredBody {
    pub fn new(inner: Body, meter: Meter) -> Self {
        Self {
            inner,
            meter,
            pending: None,
        }
    }
}

impl http_body::Body for MeteredBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.pending.is_none() {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) if frame.is_data() => this.pending = Some(frame),
                other => return Poll::Ready(other),
            }
        }
        let len = this
            .pending
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |d| d.len() as u64);
        match ready!(this.meter.poll_take(cx, len)) {
            Ok(()) => Poll::Ready(this.pending.take().map(Ok)),
            Err(why) => {
                *this.meter.refused.lock() = Some(why.clone());
                Poll::Ready(Some(Err(axum::Error::new(std::io::Error::other(why)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;

    fn body(bytes: usize) -> Body {
        Body::from(vec![7u8; bytes])
    }

    /// Reads `body` to its end, keeping it (and what it holds).
    async fn read(body: &mut MeteredBody) -> Result<u64, axum::Error> {
        let mut read = 0;
        loop {
            match std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
                None => return Ok(read),
                Some(Err(e)) => return Err(e),
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, |d| d.len() as u64),
            }
        }
    }

    #[tokio::test]
    async fn bodies_take_the_budget_as_they_arrive_and_one_token_at_most_its_share() {
        let memory = BodyMemory::new(PER_HOLDER + PER_HOLDER / 2);
        assert!(
            memory.meter("site a", PER_HOLDER + 1, 0).is_err(),
            "never fits"
        );
        assert!(
            memory.meter("site a", PER_HOLDER + 100, 100).is_ok(),
            "the free bytes are not held"
        );
        // A body announced at the token's whole share that has sent nothing holds nothing:
        // another token's body is read at once.
        let slow = memory.meter("site a", PER_HOLDER, 0).unwrap();
        let meter = memory.meter("site b", 1 << 20, 0).unwrap();
        let mut other = MeteredBody::new(body(1 << 20), meter);
        assert_eq!(read(&mut other).await.unwrap(), 1 << 20);
        drop((slow, other));
        // What a token holds counts against its share.
        let first = memory.meter("site a", PER_HOLDER, 0).unwrap();
        let mut held = MeteredBody::new(body(PER_HOLDER as usize), first);
        assert_eq!(read(&mut held).await.unwrap(), PER_HOLDER);
        let second = memory.meter("site a", 10, 0).unwrap();
        let refused = second.refused();
        assert!(read(&mut MeteredBody::new(body(10), second)).await.is_err());
        assert!(refused.lock().as_deref().unwrap().contains("site a has"));
        drop(held);
        let third = memory.meter("site a", 10, 0).unwrap();
        assert_eq!(
            read(&mut MeteredBody::new(body(10), third)).await.unwrap(),
            10
        );
    }
}
