//! Ordo's scheduler: a fixed pool of long-lived workers that run every CPU stage of a
//! pipeline, each time choosing the next activation (one item through one stage) from what the
//! stages' queues hold, and replacing at once a worker that dies.
//!
//! Priority (Ordo thesis, §3.2.3): `readable_i × (target_i + i)`, where `readable_i` is what the
//! stage's input queue holds, `i` its position in the pipeline, and `target_i` how many items
//! the stages after it still need for the queue before the sink to hold [`Pool::last_queue`]
//! items: recomputed every [`TARGETS_EVERY`] from the sink backwards. A stage whose queue is
//! empty, whose output has no room for what an activation may emit (its running selectivity,
//! the most items one activation emitted), or whose workers limit is reached (the raw hash runs
//! one file's parts in order, one at a time) is not chosen. Among equal priorities the later
//! stage goes first, which finishes items in flight before starting new ones.
//!
//! A worker never blocks on a full queue while it holds a pool slot: it is only given an
//! activation whose output has room. It sleeps when nothing can run, and is woken by every
//! item put into or taken out of the pipeline's queues ([`Wake`]).
//!
//! Self-repair: an activation that panics loses its item; what the item's [`Salvage`] kept
//! before the job ran goes on in its place, carrying the failure (file and part) to the sink,
//! and the worker's thread ends and a new one takes its place. A test hook ([`WorkerKills`],
//! for the tests and the benchmark only) kills a share of the pool every so often: a worker so
//! killed dies as it takes its next item, before the job touched it, so the item is handed to
//! the next worker unharmed (retried), and the output is the same.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::Scope;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use parking_lot::{Condvar, Mutex};

use crate::{Demand, Emit, Rank, Salvage, StageStats, Weigh};

/// How often the stages' targets are worked out again.
pub const TARGETS_EVERY: Duration = Duration::from_millis(500);
/// How long an idle worker sleeps before it looks again without being woken: a safety net
/// only, since every item taken or handed on, and every stage that ends, wakes the workers
/// (an idle daemon's pool must not poll).
const IDLE_WAIT: Duration = Duration::from_millis(200);

/// Wakes idle pool workers when something moved in a queue.
#[derive(Debug, Default)]
pub struct Wake {
    moves: Mutex<u64>,
    moved: Condvar,
}

impl Wake {
    pub fn poke(&self) {
        *self.moves.lock() += 1;
        self.moved.notify_all();
    }

    fn moves(&self) -> u64 {
        *self.moves.lock()
    }

    /// Sleeps until something moved after `seen`, or `IDLE_WAIT`.
    fn wait(&self, seen: u64) {
        let mut moves = self.moves.lock();
        if *moves == seen {
            self.moved.wait_for(&mut moves, IDLE_WAIT);
        }
    }
}

/// One CPU stage as the pool sees it, whatever its items' types.
trait Operator: Send + Sync {
    /// Items it could take now.
    fn readable(&self) -> usize;
    /// Whether it can take an item now: it has one, a free worker slot, and room in its output
    /// for what an activation may emit.
    fn runnable(&self) -> bool;
    /// Items waiting in its output queue (`None` once it ended).
    fn output_len(&self) -> Option<usize>;
    /// Ends the stage (closes its output) if its input is closed and drained and nothing of it
    /// runs; whether it has ended.
    fn ended(&self) -> bool;
    /// Runs one item through the stage (`die`: the test hook's kill, before the job runs).
    fn activate(&self, die: bool) -> Activation;
    fn rank(&self) -> Rank;
}

#[derive(Debug, PartialEq, Eq)]
enum Activation {
    Ran,
    /// Nothing to take (another worker took it first).
    Idle,
    /// The worker died: the job panicked (its item went on as a failure), or the test hook
    /// killed it (its item waits for the next worker).
    Died,
}

/// A CPU stage run by the pool.
struct Op<I, O, F> {
    rank: Rank,
    input: Receiver<I>,
    job: F,
    stats: Arc<StageStats>,
    wake: Arc<Wake>,
    /// The most of its items in hand at once (its workers).
    slots: usize,
    /// The most items one activation emitted so far (at least 1): the room it needs.
    selectivity: AtomicUsize,
    state: Mutex<OpState<I, O>>,
}

/// What a worker takes to run a stage's job once: an item, its worker slot, and the output to
/// emit to.
struct Taken<I, O> {
    item: I,
    slot: usize,
    output: Sender<O>,
}

struct OpState<I, O> {
    /// `None` once the stage ended.
    output: Option<Sender<O>>,
    /// Items taken back from a worker that died before it worked on them, and any taken from
    /// the input while checking whether it is closed: taken before the input.
    held: VecDeque<I>,
    /// Worker slots free (indices into the stage's busy-time counters).
    free: Vec<usize>,
}

impl<I, O, F> Op<I, O, F>
where
    I: Weigh + Salvage + Send,
    O: Weigh + Salvage<Remains = I::Remains> + Send,
    F: Fn(I, &mut Emit<'_, O>) + Send + Sync,
{
    fn room(&self, state: &OpState<I, O>) -> bool {
        let Some(output) = &state.output else {
            return false;
        };
        let running = self.slots - state.free.len();
        let needed = (running + 1) * self.selectivity.load(Ordering::Relaxed);
        output.capacity().unwrap_or(usize::MAX) >= output.len() + needed
    }

    /// Takes an item and a worker slot, with the output to emit to.
    fn take(&self) -> Option<Taken<I, O>> {
        let mut state = self.state.lock();
        if state.free.is_empty() || !self.room(&state) {
            return None;
        }
        let output = state.output.clone()?;
        let item = match state.held.pop_front() {
            Some(item) => item,
            None => self.input.try_recv().ok()?,
        };
        let slot = state.free.pop().expect("checked above");
        Some(Taken { item, slot, output })
    }
}

impl<I, O, F> Operator for Op<I, O, F>
where
    I: Weigh + Salvage + Send,
    O: Weigh + Salvage<Remains = I::Remains> + Send,
    F: Fn(I, &mut Emit<'_, O>) + Send + Sync,
{
    fn readable(&self) -> usize {
        self.input.len() + self.state.lock().held.len()
    }

    fn runnable(&self) -> bool {
        let state = self.state.lock();
        !state.free.is_empty()
            && self.room(&state)
            && (!state.held.is_empty() || !self.input.is_empty())
    }

    fn output_len(&self) -> Option<usize> {
        self.state.lock().output.as_ref().map(|o| o.len())
    }

    fn ended(&self) -> bool {
        let mut state = self.state.lock();
        if state.output.is_none() {
            return true;
        }
        if state.free.len() < self.slots || !state.held.is_empty() {
            return false;
        }
        match self.input.try_recv() {
            Ok(item) => {
                state.held.push_back(item);
                false
            }
            Err(TryRecvError::Empty) => false,
            Err(TryRecvError::Disconnected) => {
                state.output = None;
                drop(state);
                self.wake.poke();
                true
            }
        }
    }

    fn activate(&self, die: bool) -> Activation {
        let Some(Taken { item, slot, output }) = self.take() else {
            return Activation::Idle;
        };
        self.wake.poke();
        if die {
            // Killed holding the item, before working on it: the next worker takes it.
            let mut state = self.state.lock();
            state.held.push_front(item);
            state.free.push(slot);
            drop(state);
            self.wake.poke();
            return Activation::Died;
        }
        self.stats.took(&item);
        let remains = item.remains();
        let mut emit = Emit {
            wake: Some(&self.wake),
            ..Emit::new(&output, &self.stats, slot)
        };
        self.stats.start_work(slot);
        let outcome = catch_unwind(AssertUnwindSafe(|| (self.job)(item, &mut emit)));
        self.stats.stop_work(slot);
        let emitted = emit.emitted;
        let died = match outcome {
            Ok(()) => false,
            Err(panic) => {
                let error = format!(
                    "the {} stage's worker died: {}",
                    self.stats.name,
                    panic_message(&panic)
                );
                emit.send(O::lost(remains, error));
                true
            }
        };
        self.selectivity
            .fetch_max(emitted.max(1), Ordering::Relaxed);
        self.state.lock().free.push(slot);
        self.wake.poke();
        if died {
            Activation::Died
        } else {
            Activation::Ran
        }
    }

    fn rank(&self) -> Rank {
        self.rank
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panicked".into())
}

/// A test hook, for the tests and the benchmark only: kill `share` of the pool's workers every
/// `every` (fractions of a worker add up until they make one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerKills {
    pub share: f64,
    pub every: Duration,
}

impl std::str::FromStr for WorkerKills {
    type Err = String;

    /// `SHARE,SECONDS`, e.g. `0.6,4`.
    fn from_str(spec: &str) -> Result<Self, String> {
        let bad = || format!("{spec:?} is not SHARE,SECONDS (e.g. 0.6,4)");
        let (share, seconds) = spec.split_once(',').ok_or_else(bad)?;
        let share: f64 = share.trim().parse().map_err(|_| bad())?;
        let seconds: f64 = seconds.trim().parse().map_err(|_| bad())?;
        if !(0.0..=1.0).contains(&share) || !seconds.is_finite() || seconds <= 0.0 {
            return Err(bad());
        }
        Ok(Self {
            share,
            every: Duration::from_secs_f64(seconds),
        })
    }
}

/// What the pool's workers share.
pub(crate) struct Pool<'scope> {
    workers: usize,
    ops: Mutex<Vec<Arc<dyn Operator + 'scope>>>,
    wake: Arc<Wake>,
    plan: Mutex<Plan>,
    /// Whether stages may still be added (workers stay while it is).
    open: Mutex<bool>,
    kills: Option<WorkerKills>,
    /// Workers that died and were replaced.
    replaced: Arc<AtomicU64>,
    /// Times a worker looked for work (the tests count them).
    looks: AtomicU64,
}

/// The targets and the kills due.
struct Plan {
    targets: Vec<usize>,
    at: Instant,
    kills_at: Instant,
    /// Kills due (a share of the pool accumulates until it makes whole workers).
    kills_due: f64,
}

impl<'scope> Pool<'scope> {
    pub(crate) fn new(
        workers: usize,
        wake: Arc<Wake>,
        replaced: Arc<AtomicU64>,
        kills: Option<WorkerKills>,
    ) -> Self {
        let now = Instant::now();
        Self {
            workers: workers.max(1),
            ops: Mutex::default(),
            wake,
            plan: Mutex::new(Plan {
                targets: vec![],
                at: now,
                kills_at: now + kills.map_or(Duration::ZERO, |k| k.every),
                kills_due: 0.0,
            }),
            open: Mutex::new(true),
            kills,
            replaced,
            looks: AtomicU64::new(0),
        }
    }

    /// Times a worker looked for work so far.
    #[cfg(test)]
    pub(crate) fn looks(&self) -> u64 {
        self.looks.load(Ordering::Relaxed)
    }

    /// Adds a CPU stage; the workers start with the first.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add<I, O, F>(
        self: &Arc<Self>,
        scope: &'scope Scope<'scope, '_>,
        rank: Rank,
        slots: usize,
        stats: Arc<StageStats>,
        input: Receiver<I>,
        output: Sender<O>,
        job: F,
    ) where
        I: Weigh + Salvage + Send + 'scope,
        O: Weigh + Salvage<Remains = I::Remains> + Send + 'scope,
        F: Fn(I, &mut Emit<'_, O>) + Send + Sync + 'scope,
    {
        let op = Op {
            rank,
            input,
            job,
            stats,
            wake: self.wake.clone(),
            slots,
            selectivity: AtomicUsize::new(1),
            state: Mutex::new(OpState {
                output: Some(output),
                held: VecDeque::new(),
                free: (0..slots).rev().collect(),
            }),
        };
        let first = {
            let mut ops = self.ops.lock();
            ops.push(Arc::new(op));
            ops.len() == 1
        };
        if first {
            for _ in 0..self.workers {
                self.spawn_worker(scope);
            }
        }
    }

    /// Whether no stage was added yet.
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.lock().is_empty()
    }

    /// No more stages: workers end once every stage has.
    pub(crate) fn close(&self) {
        *self.open.lock() = false;
        self.wake.poke();
    }

    fn spawn_worker(self: &Arc<Self>, scope: &'scope Scope<'scope, '_>) {
        let pool = self.clone();
        std::thread::Builder::new()
            .name("forte-pool".into())
            .spawn_scoped(scope, move || {
                if pool.work() {
                    pool.replaced.fetch_add(1, Ordering::Relaxed);
                    pool.spawn_worker(scope);
                }
            })
            .expect("spawning a pool worker thread");
    }

    /// A worker's life: activations until every stage ended (false) or it dies (true).
    fn work(&self) -> bool {
        loop {
            let seen = self.wake.moves();
            self.looks.fetch_add(1, Ordering::Relaxed);
            match self.choose() {
                Some(op) => {
                    let die = self.kill_due();
                    match op.activate(die) {
                        Activation::Died => return true,
                        // Nothing to die holding: the kill stays due.
                        Activation::Idle if die => self.plan.lock().kills_due += 1.0,
                        Activation::Ran | Activation::Idle => {}
                    }
                }
                None if self.finished() => return false,
                None => self.wake.wait(seen),
            }
        }
    }

    fn finished(&self) -> bool {
        let ops = self.ops.lock().clone();
        // Every stage is asked, so that each closes as soon as it can.
        let ended = ops.iter().filter(|op| op.ended()).count();
        ended == ops.len() && !*self.open.lock()
    }

    /// The runnable stage of highest priority.
    fn choose(&self) -> Option<Arc<dyn Operator + 'scope>> {
        let ops = self.ops.lock().clone();
        let targets = self.targets(&ops);
        ops.iter()
            .zip(targets)
            .filter(|(op, _)| op.runnable())
            .max_by_key(|(op, target)| {
                let priority = op.readable() * (target + op.rank());
                (priority, op.rank())
            })
            .map(|(op, _)| op.clone())
    }

    /// Each stage's target, worked out again if it is time: the last stage's is what the
    /// queue before the sink lacks of [`Pool::last_queue`], each earlier one's what the next
    /// stage's target lacks of what its input already holds.
    fn targets(&self, ops: &[Arc<dyn Operator + 'scope>]) -> Vec<usize> {
        let mut plan = self.plan.lock();
        if plan.targets.len() == ops.len() && plan.at.elapsed() < TARGETS_EVERY {
            return plan.targets.clone();
        }
        let mut targets = vec![0; ops.len()];
        let mut needed = self.last_queue();
        for (i, op) in ops.iter().enumerate().rev() {
            let waiting = match ops.get(i + 1) {
                Some(next) => next.readable(),
                None => op.output_len().unwrap_or(0),
            };
            needed = needed.saturating_sub(waiting);
            targets[i] = needed;
        }
        plan.targets = targets.clone();
        plan.at = Instant::now();
        targets
    }

    /// Items the queue before the sink should hold: one per worker, so that the sink always
    /// finds work while the pool prepares the next.
    fn last_queue(&self) -> usize {
        self.workers
    }

    /// Whether the test hook kills this worker now.
    fn kill_due(&self) -> bool {
        let Some(kills) = self.kills else {
            return false;
        };
        let mut plan = self.plan.lock();
        while plan.kills_at <= Instant::now() {
            plan.kills_due += kills.share * self.workers as f64;
            plan.kills_at += kills.every;
        }
        if plan.kills_due >= 1.0 {
            plan.kills_due -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The pool wants another item when its queues hold fewer than it has workers: each worker
/// finds one waiting when it is free, and no more are read ahead, so an item's time from read
/// to sink is its work and not a wait in a queue.
impl Demand for Pool<'_> {
    fn wait(&self) {
        loop {
            let seen = self.wake.moves();
            let ops = self.ops.lock().clone();
            let queued: usize = ops.iter().map(|op| op.readable()).sum();
            if queued < self.workers || !*self.open.lock() {
                return;
            }
            self.wake.wait(seen);
        }
    }
}
