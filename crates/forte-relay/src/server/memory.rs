//! The memory that request bodies held whole take: a JSON body while it is parsed (a seal, a
//! batch's inventory, an acknowledgement), a one-part object's manifest. Each route bounds its
//! own body (`api::MAX_*`); this bounds them together, so that many large seals at once, from
//! one site's token or several, cannot exhaust the relay's memory. A request takes its
//! declared length from the budget before a byte of its body is read, waits a while for room if
//! there is none, and gives it back once answered; one token's requests together hold at most
//! [`PER_HOLDER`] of it. Part bodies are not held (they go to disk as they arrive).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::MAX_BATCH_SEAL_JSON;

/// What one token's requests may hold at once: the largest body a route takes.
pub const PER_HOLDER: u64 = MAX_BATCH_SEAL_JSON as u64;

/// The default budget for every request together.
pub const DEFAULT_BUDGET: u64 = 512 << 20;

/// How long a request waits for room before it is told to retry (503).
const WAIT_FOR_ROOM: Duration = Duration::from_secs(30);

/// The budget is counted in units of this many bytes (a semaphore's permits are `u32`).
const UNIT: u64 = 1 << 10;

/// The relay's budget for bodies held whole.
pub struct BodyMemory {
    budget: u64,
    room: Arc<Semaphore>,
    by_holder: Arc<Mutex<HashMap<String, u64>>>,
}

/// Bytes of the budget a request holds until it is dropped.
pub struct Held {
    /// Given back to the budget when dropped.
    permit: Option<OwnedSemaphorePermit>,
    holder: String,
    bytes: u64,
    by_holder: Arc<Mutex<HashMap<String, u64>>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut by_holder = self.by_holder.lock();
        if let Some(held) = by_holder.get_mut(&self.holder) {
            *held -= self.bytes;
            if *held == 0 {
                by_holder.remove(&self.holder);
            }
        }
    }
}

/// Why a request cannot hold its body: at once (it could never fit), or after waiting.
#[derive(Debug, PartialEq, Eq)]
pub enum NoRoom {
    /// Larger than the whole budget, or than one token may hold: retrying cannot help.
    TooLarge(String),
    /// Held by others now: worth retrying.
    Busy(String),
}

impl BodyMemory {
    pub fn new(budget: u64) -> Self {
        let units = budget.div_ceil(UNIT).min(u64::from(u32::MAX)) as usize;
        Self {
            budget,
            room: Arc::new(Semaphore::new(units)),
            by_holder: Arc::default(),
        }
    }

    /// Takes `bytes` of the budget for a request of `holder` (its token's site or role), waiting
    /// up to [`WAIT_FOR_ROOM`] for others to give some back.
    pub async fn hold(&self, holder: &str, bytes: u64) -> Result<Held, NoRoom> {
        if bytes > self.budget {
            return Err(NoRoom::TooLarge(format!(
                "a body of {bytes} bytes does not fit in the relay's memory for request bodies ({} bytes, relay --body-memory)",
                self.budget
            )));
        }
        {
            let mut by_holder = self.by_holder.lock();
            let held = by_holder.entry(holder.to_string()).or_default();
            if *held + bytes > PER_HOLDER {
                let now = *held;
                return Err(if now == 0 {
                    NoRoom::TooLarge(format!("a body of {bytes} bytes is more than one token may send at once ({PER_HOLDER})"))
                } else {
                    NoRoom::Busy(format!("{holder} has {now} bytes of request bodies in the relay's memory already; {bytes} more exceed the {PER_HOLDER} one token may hold: retry"))
                });
            }
            *held += bytes;
        }
        let mut held = Held {
            permit: None,
            holder: holder.to_string(),
            bytes,
            by_holder: self.by_holder.clone(),
        };
        if bytes == 0 {
            return Ok(held);
        }
        let units = bytes.div_ceil(UNIT) as u32;
        let wait = tokio::time::timeout(WAIT_FOR_ROOM, self.room.clone().acquire_many_owned(units));
        match wait.await {
            Ok(Ok(permit)) => {
                held.permit = Some(permit);
                Ok(held)
            }
            _ => Err(NoRoom::Busy(format!(
                "the relay holds as many request bodies in memory as it may ({} bytes): retry",
                self.budget
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bodies_together_stay_within_the_budget_and_one_token_within_its_share() {
        let memory = BodyMemory::new(PER_HOLDER + (PER_HOLDER / 2));
        let a = memory.hold("site a", PER_HOLDER).await.unwrap();
        assert!(matches!(
            memory.hold("site a", 1).await,
            Err(NoRoom::Busy(m)) if m.contains("site a has")
        ));
        assert!(matches!(
            memory.hold("site b", PER_HOLDER + 1).await,
            Err(NoRoom::TooLarge(_))
        ));
        let b = memory.hold("site b", PER_HOLDER / 2).await.unwrap();
        // Full: a third token waits, and gets room once one is answered.
        let waiting = tokio::spawn({
            let memory = Arc::new(memory);
            let m = memory.clone();
            async move { m.hold("site c", 10 << 20).await.map(drop) }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(a);
        waiting.await.unwrap().unwrap();
        drop(b);
    }
}
