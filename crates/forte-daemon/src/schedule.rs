//! Which batch's work goes next: the queue policies of `--policy`, shared by the edge (which
//! file to prepare and upload next) and the core (which ready batch to pull next).
//!
//! Work is handed out one file at a time and the choice is made at that moment, so a small
//! batch that arrives while a large one is being sent overtakes it at the next file boundary
//! (preemptive shortest-remaining-first) rather than waiting behind it, the convoy effect the
//! FORTE paper measured under Airflow's FIFO pools.

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    /// First come, first served (Airflow's pools).
    Fifo,
    /// Smallest remaining bytes first; can starve a large batch while small ones keep coming.
    Sjf,
    /// Smallest remaining bytes first, but a batch that has waited --max-wait goes first.
    SjfAging,
    /// Highest priority first (from the .ready marker or --priority rules), ties by sjf-aging.
    Priority,
    /// A share of the work (--small-share of the bytes) for the smallest batch, the rest for
    /// the largest, as rclone's `--order-by size,mixed`.
    Lanes,
}

/// A batch-name rule of the `priority` policy: `PATTERN=N`, `*` matching any run of
/// characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityRule {
    pattern: String,
    priority: i64,
}

impl std::str::FromStr for PriorityRule {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let (pattern, priority) = text.rsplit_once('=').ok_or_else(|| {
            format!("priority rule {text:?} must be PATTERN=NUMBER, e.g. 'incident-*=10'")
        })?;
        let priority = priority
            .trim()
            .parse()
            .map_err(|_| format!("priority rule {text:?}: {priority:?} is not a whole number"))?;
        Ok(Self {
            pattern: pattern.trim().to_string(),
            priority,
        })
    }
}

#[derive(Debug, Clone)]
pub struct Policy {
    pub name: PolicyName,
    pub max_wait: Duration,
    pub small_share: f64,
    rules: Vec<PriorityRule>,
}

impl Policy {
    /// The order in which this policy gives running batches the link, for their ETAs: the
    /// smallest remaining first under sjf and sjf-aging, else as they began.
    pub fn eta_order(&self) -> forte_view::model::Order {
        match self.name {
            PolicyName::Sjf | PolicyName::SjfAging => forte_view::model::Order::LeastRemaining,
            PolicyName::Fifo | PolicyName::Priority | PolicyName::Lanes => {
                forte_view::model::Order::AsBegun
            }
        }
    }

    pub fn new(
        name: PolicyName,
        max_wait: Duration,
        small_share: f64,
        rules: Vec<PriorityRule>,
    ) -> Self {
        Self {
            name,
            max_wait,
            small_share,
            rules,
        }
    }
}

/// What a policy knows of a batch that has work left.
#[derive(Debug, Clone, Copy)]
pub struct Waiting {
    pub arrived: Instant,
    pub remaining: u64,
    pub priority: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Small,
    Large,
}

impl Policy {
    /// A batch's priority: a number in its `.ready` marker, else the first matching rule,
    /// else 0.
    pub fn priority_of(&self, name: &str, marker: Option<&Path>) -> i64 {
        let from_marker = marker
            .and_then(|m| std::fs::read_to_string(m).ok())
            .and_then(|text| {
                let text = text.trim();
                let value = text.rsplit_once('=').map_or(text, |(_, v)| v);
                value.trim().parse().ok()
            });
        from_marker
            .or_else(|| {
                self.rules
                    .iter()
                    .find(|r| glob_match(&r.pattern, name))
                    .map(|r| r.priority)
            })
            .unwrap_or(0)
    }

    /// The index of the batch to serve next among `batches` (not empty) at `now`.
    fn pick(&self, batches: &[Waiting], now: Instant, lane: Lane) -> usize {
        let indices = 0..batches.len();
        let oldest = |i: &usize| batches[*i].arrived;
        let smallest = |i: &usize| (batches[*i].remaining, batches[*i].arrived);
        let aging = |among: &mut dyn Iterator<Item = usize>| -> usize {
            let among: Vec<usize> = among.collect();
            let overdue = among
                .iter()
                .copied()
                .filter(|&i| now.duration_since(batches[i].arrived) >= self.max_wait)
                .min_by_key(oldest);
            overdue
                .or_else(|| among.iter().copied().min_by_key(smallest))
                .expect("at least one batch")
        };
        match self.name {
            PolicyName::Fifo => indices.min_by_key(oldest).expect("at least one batch"),
            PolicyName::Sjf => indices.min_by_key(smallest).expect("at least one batch"),
            PolicyName::SjfAging => aging(&mut indices.into_iter()),
            PolicyName::Priority => {
                let top = batches.iter().map(|b| b.priority).max().unwrap_or(0);
                aging(&mut indices.filter(|&i| batches[i].priority == top))
            }
            PolicyName::Lanes => match lane {
                Lane::Small => aging(&mut indices.into_iter()),
                Lane::Large => indices
                    .max_by_key(|&i| (batches[i].remaining, std::cmp::Reverse(batches[i].arrived)))
                    .expect("at least one batch"),
            },
        }
    }

    /// `batches` in the order this policy serves them at `now`, as if each were served whole.
    pub fn order<T>(&self, mut batches: Vec<(Waiting, T)>, now: Instant) -> Vec<T> {
        let mut ordered = Vec::with_capacity(batches.len());
        let mut lanes = LaneShare::default();
        while !batches.is_empty() {
            let waiting: Vec<Waiting> = batches.iter().map(|(w, _)| *w).collect();
            let lane = lanes.next(self.small_share);
            let (w, item) = batches.remove(self.pick(&waiting, now, lane));
            lanes.served(lane, w.remaining);
            ordered.push(item);
        }
        ordered
    }
}

/// Bytes handed to each lane so far; the lane furthest behind its share goes next.
#[derive(Default)]
struct LaneShare {
    small: u64,
    large: u64,
}

impl LaneShare {
    fn next(&self, small_share: f64) -> Lane {
        let total = (self.small + self.large) as f64;
        if (self.small as f64) < small_share * total || (total == 0.0 && small_share > 0.0) {
            Lane::Small
        } else {
            Lane::Large
        }
    }

    fn served(&mut self, lane: Lane, bytes: u64) {
        let bytes = bytes.max(1);
        match lane {
            Lane::Small => self.small += bytes,
            Lane::Large => self.large += bytes,
        }
    }
}

/// `*` matches any run of characters, everything else itself.
fn glob_match(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            let Some(tail) = name.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len())
                .filter(|&i| tail.is_char_boundary(i))
                .any(|i| glob_match(rest, &tail[i..]))
        }
    }
}

/// What a [`BatchQueue`] holds at one moment.
#[derive(Debug, Clone, Copy)]
pub struct QueueTotals {
    /// Items queued, of every batch.
    pub items: usize,
    /// Their bytes.
    pub bytes: u64,
}

/// Work items of many batches, handed out one at a time in the order of a [`Policy`].
/// `next` blocks while the queue is empty until more work is admitted or the queue is closed.
pub struct BatchQueue<T> {
    policy: Policy,
    state: Mutex<QueueState<T>>,
    changed: Condvar,
}

struct QueueState<T> {
    batches: Vec<Queued<T>>,
    lanes: LaneShare,
    closed: bool,
}

struct Queued<T> {
    waiting: Waiting,
    items: VecDeque<(T, u64)>,
}

impl<T> BatchQueue<T> {
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            state: Mutex::new(QueueState {
                batches: Vec::new(),
                lanes: LaneShare::default(),
                closed: false,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState<T>> {
        self.state.lock()
    }

    /// Queues a batch's items, each with its size in bytes.
    pub fn admit(&self, arrived: Instant, priority: i64, items: Vec<(T, u64)>) {
        if items.is_empty() {
            return;
        }
        let remaining = items.iter().map(|(_, size)| size).sum();
        self.lock().batches.push(Queued {
            waiting: Waiting {
                arrived,
                remaining,
                priority,
            },
            items: items.into(),
        });
        self.changed.notify_all();
    }

    /// No more batches will come: `next` returns `None` once the queue is empty.
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// Batches may come again, after a close.
    pub fn reopen(&self) {
        self.lock().closed = false;
    }

    /// Whether no more batches will come ([`BatchQueue::close`]): what is queued is all there is.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Items and bytes queued.
    pub fn totals(&self) -> QueueTotals {
        let state = self.lock();
        let items = state.batches.iter().map(|b| b.items.len()).sum();
        let bytes = state.batches.iter().map(|b| b.waiting.remaining).sum();
        QueueTotals { items, bytes }
    }

    /// Removes and returns any queued item, without waiting (for draining).
    pub fn take_any(&self) -> Option<T> {
        let mut state = self.lock();
        let batch = state.batches.last_mut()?;
        let (item, size) = batch.items.pop_front().expect("queued batches have items");
        batch.waiting.remaining -= size;
        if batch.items.is_empty() {
            state.batches.pop();
        }
        Some(item)
    }

    /// The next item as the policy chooses, waiting for work if there is none yet.
    pub fn next(&self) -> Option<T> {
        let mut state = self.lock();
        loop {
            if !state.batches.is_empty() {
                let waiting: Vec<Waiting> = state.batches.iter().map(|b| b.waiting).collect();
                let lane = state.lanes.next(self.policy.small_share);
                let chosen = self.policy.pick(&waiting, Instant::now(), lane);
                let batch = &mut state.batches[chosen];
                let (item, size) = batch.items.pop_front().expect("queued batches have items");
                batch.waiting.remaining -= size;
                if batch.items.is_empty() {
                    state.batches.swap_remove(chosen);
                }
                state.lanes.served(lane, size);
                return Some(item);
            }
            if state.closed {
                return None;
            }
            self.changed.wait(&mut state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: PolicyName, max_wait: Duration) -> Policy {
        Policy {
            name,
            max_wait,
            small_share: 0.25,
            rules: vec!["incident-*=7".parse().unwrap()],
        }
    }

    /// Drains a queue of batches (name, seconds ago it arrived, sizes) and returns the batch
    /// name of every item in the order served.
    fn serve(p: Policy, batches: &[(&str, u64, &[u64])]) -> String {
        let now = Instant::now();
        let q = BatchQueue::new(p);
        for (name, ago, sizes) in batches {
            let items = sizes.iter().map(|&s| (name.to_string(), s)).collect();
            let priority = q.policy.priority_of(name, None);
            q.admit(now - Duration::from_secs(*ago), priority, items);
        }
        q.close();
        std::iter::from_fn(|| q.next()).collect::<Vec<_>>().join("")
    }

    const SET: &[(&str, u64, &[u64])] =
        &[("I", 30, &[50, 50]), ("J", 20, &[20]), ("K", 10, &[5, 5])];

    #[test]
    fn fifo_serves_in_arrival_order() {
        assert_eq!(serve(policy(PolicyName::Fifo, Duration::MAX), SET), "IIJKK");
    }

    #[test]
    fn sjf_serves_smallest_remaining_first() {
        assert_eq!(serve(policy(PolicyName::Sjf, Duration::MAX), SET), "KKJII");
    }

    #[test]
    fn aging_puts_an_overdue_batch_first() {
        let p = policy(PolicyName::SjfAging, Duration::from_secs(25));
        assert_eq!(serve(p, SET), "IIKKJ");
    }

    #[test]
    fn priority_from_rules_then_aging() {
        let p = policy(PolicyName::Priority, Duration::from_secs(3600));
        let set: &[(&str, u64, &[u64])] = &[("big", 30, &[50]), ("incident-7", 1, &[90])];
        assert_eq!(serve(p, set), "incident-7big");
    }

    #[test]
    fn lanes_share_between_smallest_and_largest() {
        let p = policy(PolicyName::Lanes, Duration::MAX);
        let set: &[(&str, u64, &[u64])] = &[("L", 3, &[10, 10, 10, 10]), ("s", 2, &[1, 1, 1])];
        // The lane furthest behind its share of the bytes picks: small (s), large (L: 10 of
        // 11 bytes), small twice (1 and 2 of 12 are under a quarter), then with s served the
        // small lane takes the smallest left, which is L.
        assert_eq!(serve(p, set), "sLssLLL");
    }

    #[test]
    fn glob_matches_stars() {
        assert!(glob_match("incident-*", "incident-42"));
        assert!(glob_match("*-night", "run-7-night"));
        assert!(!glob_match("incident-*", "routine"));
    }

    #[test]
    fn priority_from_marker_beats_rules() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join(".ready");
        std::fs::write(&marker, "priority = 3\n").unwrap();
        let p = policy(PolicyName::Priority, Duration::MAX);
        assert_eq!(p.priority_of("incident-1", Some(&marker)), 3);
        assert_eq!(p.priority_of("incident-1", None), 7);
        assert_eq!(p.priority_of("routine", None), 0);
    }
}
