//! Stages joined by bounded queues, with their depth and service rate observable while they run.
//!
//! A [`Pipeline`] is a set of named stages. Each stage owns a bounded input queue and a fixed
//! number of worker threads that take items from it, do one job, and hand zero or more results
//! to the next stage's queue. Bounded queues are the memory bound and the backpressure: a slow
//! stage fills the queue in front of it and the stages upstream block.
//!
//! Stages that burn CPU (hashing, compression, encryption) take a token from a shared
//! [`Budget`] for the time they compute, so the whole pipeline never runs more CPU-bound
//! workers at once than the budget allows, however many threads the stages own. I/O stages
//! (reading files, writing or uploading) do not take tokens: they mostly wait. When workers of
//! several stages wait for a token, the one furthest down the pipeline gets it: finishing an
//! item already in flight before starting the next keeps as little as possible in flight and
//! gets the first results out soonest. The total work is the same, so throughput is too; on one
//! core, the first object of a send reached the network 107 ms after the first read when every
//! stage competed, because each new part was read, hashed and compressed beside the first.
//!
//! Who runs the CPU stages is the [`Scheduler`]'s choice. Under [`Scheduler::Ordo`] (the
//! default) a fixed pool of one worker per CPU token runs every CPU stage, choosing each next
//! activation by the metrics-aware priority of the Ordo thesis and replacing a worker that dies
//! (`pool`). Under [`Scheduler::Threads`] each CPU stage owns its threads and they share the
//! cores through the budget's tokens, as described above. I/O stages own their threads under
//! both.
//!
//! Every stage keeps counters ([`StageStats`]) that anyone holding the pipeline can read at any
//! time through [`Pipeline::snapshot`]: queue depth, items and bytes in and out, and the time
//! its workers were busy, which gives the stage's service rate. Progress bars, `--json`
//! summaries, and later the scheduler and the KPI reports read these numbers.

mod latency;
mod pool;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use latency::{Latencies, LatencySnapshot};
pub use pool::WorkerKills;
use pool::{Pool, Wake};

use parking_lot::{Condvar, Mutex};
use std::thread::Scope;
use std::time::Instant;

pub use crossbeam_channel::{Receiver, Sender};

/// How many bytes an item carries, for the stage counters.
pub trait Weigh {
    /// What one item is (an `object`, a `part`): a stage counts the items it takes in this
    /// unit, which its counters carry, since stages of one pipeline take different things.
    const ITEM: &'static str = "item";

    fn weight(&self) -> u64;

    /// When the item was read: its latency runs from then until the sink takes it.
    fn read_at(&self) -> Option<Instant> {
        None
    }
}

impl<T: Weigh> Weigh for Arc<T> {
    const ITEM: &'static str = T::ITEM;

    fn weight(&self) -> u64 {
        T::weight(self)
    }

    fn read_at(&self) -> Option<Instant> {
        T::read_at(self)
    }
}

impl<T: Weigh, E> Weigh for Result<T, E> {
    const ITEM: &'static str = T::ITEM;

    fn weight(&self) -> u64 {
        self.as_ref().map_or(0, Weigh::weight)
    }

    fn read_at(&self) -> Option<Instant> {
        self.as_ref().ok().and_then(Weigh::read_at)
    }
}

/// An item a CPU stage's worker may die holding (a panic in the stage's job): what is kept of
/// it before the job runs, and the item that goes on in its place, carrying the failure to the
/// end of the pipeline, which records it against the item's file and part.
pub trait Salvage: Sized {
    /// Enough to stand for the item: which file and part it is.
    type Remains: Send;

    fn remains(&self) -> Self::Remains;

    /// The item that stands for a lost one, failed with `error`.
    fn lost(remains: Self::Remains, error: String) -> Self;
}

/// Who runs a pipeline's CPU stages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheduler {
    /// One pool of workers (one per CPU token) for every CPU stage, each activation chosen by
    /// the stages' queue fill and position (the Ordo thesis); a worker that dies is replaced.
    #[default]
    Ordo,
    /// Each CPU stage its own threads, sharing the cores through the CPU budget's tokens.
    Threads,
    /// rayon's work-stealing pool (one thread per CPU token): each item of a CPU stage a task
    /// on it (a one-worker stage's one at a time). The baseline a Rust engineer would reach for
    /// first, which bench/scheduler.py measures the others against.
    Rayon,
}

/// How a pipeline's CPU stages are run: the scheduler, and the test hook that kills pool
/// workers on a schedule (for the tests and the benchmark only).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Scheduling {
    pub scheduler: Scheduler,
    pub worker_kills: Option<WorkerKills>,
}

impl Scheduler {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ordo => "ordo",
            Self::Threads => "threads",
            Self::Rayon => "rayon",
        }
    }
}

impl std::str::FromStr for Scheduler {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        [Self::Ordo, Self::Threads, Self::Rayon]
            .into_iter()
            .find(|scheduler| scheduler.as_str() == s)
            .ok_or_else(|| format!("unknown scheduler {s:?}: ordo, threads or rayon"))
    }
}

/// A weighted counting semaphore: the CPU budget (one unit per computing worker) and the
/// memory budget of parts in flight (one unit per byte) are both one of these.
#[derive(Debug)]
pub struct Budget {
    units: Mutex<Units>,
    wake: Condvar,
    total: AtomicU64,
}

/// What a [`Budget`] has free, and the ranks of those waiting for it.
#[derive(Debug)]
struct Units {
    free: u64,
    waiting: Vec<Rank>,
}

/// A waiter's precedence for a [`Budget`]: a stage's position in its pipeline (0 for the
/// first), so that later stages are served first. Waiters of equal rank are not ordered.
pub type Rank = usize;

/// Units taken from a [`Budget`], given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<Budget>,
    units: u64,
}

impl Charge {
    /// Gives back all but `units` (if it holds more): what it stands for got smaller.
    pub fn shrink_to(&mut self, units: u64) {
        if units < self.units {
            self.budget.release(self.units - units);
            self.units = units;
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.release(self.units);
    }
}

impl Budget {
    pub fn new(total: u64) -> Arc<Self> {
        let total = total.max(1);
        Arc::new(Self {
            units: Mutex::new(Units {
                free: total,
                waiting: Vec::new(),
            }),
            wake: Condvar::new(),
            total: AtomicU64::new(total),
        })
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Raises the total to `total` units if it is lower (never lowers it: what is held stays
    /// held), and wakes whoever waits for the new room.
    pub fn grow_to(&self, total: u64) {
        let mut state = self.units.lock();
        let before = self.total.load(Ordering::Relaxed);
        if total > before {
            self.total.store(total, Ordering::Relaxed);
            state.free += total - before;
            self.wake.notify_all();
        }
    }

    /// Waits until `units` are free and takes them. A request above the total takes the
    /// whole budget, so one oversized item still proceeds, alone.
    pub fn charge(self: &Arc<Self>, units: u64) -> Charge {
        let units = units.min(self.total());
        self.acquire(units, 0);
        Charge {
            budget: self.clone(),
            units,
        }
    }

    /// Waits until `units` are free and no waiter outranks `rank`, and takes them.
    fn acquire(&self, units: u64, rank: Rank) {
        let mut state = self.units.lock();
        let held_back = |s: &Units| s.free < units || s.waiting.iter().any(|&r| r > rank);
        if held_back(&state) {
            state.waiting.push(rank);
            while held_back(&state) {
                self.wake.wait(&mut state);
            }
            let me = state.waiting.iter().position(|&r| r == rank);
            state.waiting.swap_remove(me.expect("registered above"));
            // Waiters held back only by this one may go now.
            if state.free > units && !state.waiting.is_empty() {
                self.wake.notify_all();
            }
        }
        state.free -= units;
    }

    fn release(&self, units: u64) {
        self.units.lock().free += units;
        self.wake.notify_all();
    }

    #[cfg(test)]
    fn free(&self) -> u64 {
        self.units.lock().free
    }
}

/// Large byte buffers recycled between stages, so parts in flight reuse the same memory
/// instead of asking the allocator (and the kernel, page by page) for fresh megabytes.
#[derive(Debug, Clone)]
pub struct BufferPool {
    tx: Sender<Vec<u8>>,
    rx: Receiver<Vec<u8>>,
    /// Requests below this go to the allocator; small buffers are cheap and pooling them
    /// would pin large ones for tiny files.
    min_size: usize,
}

impl BufferPool {
    pub fn new(buffers: usize, min_size: usize) -> Self {
        let (tx, rx) = crossbeam_channel::bounded(buffers.max(1));
        Self { tx, rx, min_size }
    }

    /// An empty buffer with at least `capacity` bytes of room.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        if capacity < self.min_size {
            return Vec::with_capacity(capacity);
        }
        let mut buf = self.rx.try_recv().unwrap_or_default();
        buf.clear();
        buf.reserve(capacity);
        buf
    }

    /// Returns a buffer for reuse; dropped when the pool is full or it is small.
    pub fn give(&self, buf: Vec<u8>) {
        if buf.capacity() >= self.min_size {
            let _ = self.tx.try_send(buf);
        }
    }
}

/// Counters of one stage, updated by its workers and readable at any time.
pub struct StageStats {
    name: &'static str,
    /// What the items it takes are ([`Weigh::ITEM`]).
    item: &'static str,
    work: Work,
    workers: usize,
    capacity: usize,
    depth: Box<dyn Fn() -> usize + Send + Sync>,
    items_in: AtomicU64,
    items_out: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    /// Busy time of the stretches of work that ended.
    busy_nanos: AtomicU64,
    /// When each worker's stretch of work under way began, in nanoseconds since `epoch` plus
    /// one (0: not working), so a reading counts work while it goes on, not when it ends.
    working_since: Vec<AtomicU64>,
    epoch: Instant,
    /// The highest busy time read so far: a stretch that ends between the two loads of a
    /// reading is briefly in neither, and a reading never goes back.
    busy_read: AtomicU64,
}

/// A point-in-time reading of one stage.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StageSnapshot {
    pub name: &'static str,
    /// What its items are: `items_in` counts these.
    pub item: &'static str,
    pub work: Work,
    pub workers: usize,
    /// Items waiting in the stage's input queue.
    pub queue_depth: usize,
    pub queue_capacity: usize,
    pub items_in: u64,
    pub items_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Summed over workers, the work under way included; time blocked on a full output
    /// queue or another resource is not counted.
    pub busy_seconds: f64,
    /// Input bytes per busy second of one worker: what the stage can do per worker.
    pub service_rate_bytes_per_sec: f64,
}

impl StageStats {
    /// A worker took `item` from the stage's input.
    fn took<I: Weigh>(&self, item: &I) {
        self.items_in.fetch_add(1, Ordering::Relaxed);
        self.bytes_in.fetch_add(item.weight(), Ordering::Relaxed);
    }

    fn nanos(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    /// Worker `worker` starts a stretch of work.
    fn start_work(&self, worker: usize) {
        self.working_since[worker].store(self.nanos(), Ordering::Relaxed);
    }

    /// Worker `worker`'s stretch of work ends (done, or waiting on something).
    fn stop_work(&self, worker: usize) {
        let since = self.working_since[worker].swap(0, Ordering::Relaxed);
        if since != 0 {
            let busy = self.nanos().saturating_sub(since);
            self.busy_nanos.fetch_add(busy, Ordering::Relaxed);
        }
    }

    /// Busy time so far, the stretches under way included.
    fn busy_nanos_now(&self) -> u64 {
        let ended = self.busy_nanos.load(Ordering::Relaxed);
        let now = self.nanos();
        let under_way: u64 = self
            .working_since
            .iter()
            .map(|since| match since.load(Ordering::Relaxed) {
                0 => 0,
                since => now.saturating_sub(since),
            })
            .sum();
        let busy = ended + under_way;
        self.busy_read.fetch_max(busy, Ordering::Relaxed).max(busy)
    }

    pub fn snapshot(&self) -> StageSnapshot {
        let bytes_in = self.bytes_in.load(Ordering::Relaxed);
        let busy_seconds = self.busy_nanos_now() as f64 / 1e9;
        StageSnapshot {
            name: self.name,
            item: self.item,
            work: self.work,
            workers: self.workers,
            queue_depth: (self.depth)(),
            queue_capacity: self.capacity,
            items_in: self.items_in.load(Ordering::Relaxed),
            items_out: self.items_out.load(Ordering::Relaxed),
            bytes_in,
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            busy_seconds,
            service_rate_bytes_per_sec: if busy_seconds > 0.0 {
                bytes_in as f64 / busy_seconds
            } else {
                0.0
            },
        }
    }
}

impl std::fmt::Debug for StageStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.snapshot().fmt(f)
    }
}

/// How a stage's worker hands results on. Sending blocks while the next queue is full; the
/// worker's CPU token is given back for that time so a blocked producer never starves the
/// consumer it waits for.
pub struct Emit<'a, O> {
    tx: &'a Sender<O>,
    stats: &'a StageStats,
    budget: Option<&'a Budget>,
    rank: Rank,
    /// The worker's index in its stage, whose busy time it keeps.
    worker: usize,
    /// The pool's workers to wake when an item is handed on (under [`Scheduler::Ordo`]).
    wake: Option<&'a Wake>,
    /// Items handed on so far by this activation.
    emitted: usize,
    /// Under [`Scheduler::Ordo`], for a stage that feeds the pool (reads): what says when the
    /// pool wants another item.
    demand: Option<&'a dyn Demand>,
}

/// When the stages after a source want another item.
pub(crate) trait Demand: Sync {
    /// Waits until they do.
    fn wait(&self);
}

impl<'a, O: Weigh> Emit<'a, O> {
    /// An activation's hand-off to `tx` for worker `worker` of the stage `stats` counts, with
    /// no CPU token to give back, no pool to wake and no demand to wait for.
    fn new(tx: &'a Sender<O>, stats: &'a StageStats, worker: usize) -> Self {
        Self {
            tx,
            stats,
            budget: None,
            rank: 0,
            worker,
            wake: None,
            emitted: 0,
            demand: None,
        }
    }

    /// Waits until the next stages want another item: a source calls it before it reads one,
    /// so that an item is read when it is needed, not as soon as memory allows. Under
    /// [`Scheduler::Ordo`] that is when the pool's queues hold fewer items than it has workers
    /// (Ordo schedules its source by the stages' demand too); under [`Scheduler::Threads`] at
    /// once (the queues and the memory budget bound what is read ahead).
    pub fn wait_for_demand(&mut self) {
        if let Some(demand) = self.demand {
            self.waiting(|| demand.wait());
        }
    }

    /// Passes an item to the next stage. Returns `false` when the next stage has shut down,
    /// after which the worker should stop producing.
    pub fn send(&mut self, item: O) -> bool {
        let weight = item.weight();
        let item = match self.tx.try_send(item) {
            Ok(()) => return self.sent(weight),
            Err(crossbeam_channel::TrySendError::Disconnected(_)) => return false,
            Err(crossbeam_channel::TrySendError::Full(item)) => item,
        };
        let tx = self.tx;
        let ok = self.waiting(|| tx.send(item).is_ok());
        ok && self.sent(weight)
    }

    /// Runs `wait`, something that blocks on a resource (a memory budget, a connection slot),
    /// without counting the time as busy and without holding a CPU token meanwhile.
    pub fn waiting<R>(&mut self, wait: impl FnOnce() -> R) -> R {
        self.stats.stop_work(self.worker);
        if let Some(budget) = self.budget {
            budget.release(1);
        }
        let result = wait();
        if let Some(budget) = self.budget {
            budget.acquire(1, self.rank);
        }
        self.stats.start_work(self.worker);
        result
    }

    fn sent(&mut self, weight: u64) -> bool {
        self.stats.items_out.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_out.fetch_add(weight, Ordering::Relaxed);
        self.emitted += 1;
        if let Some(wake) = self.wake {
            wake.poke();
        }
        true
    }
}

/// Whether a stage's workers compute (and so take [`Budget`] tokens) or mostly wait on I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Work {
    Cpu,
    Io,
}

/// What a stage is: its name in the counters, its kind of work, and how many workers run it.
#[derive(Debug, Clone, Copy)]
struct StageSpec {
    name: &'static str,
    work: Work,
    workers: usize,
}

/// A pipeline's run so far: who ran the computing stages, each stage's counters, the items'
/// latency from read to sink, and the pool workers that died and were replaced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reading {
    pub scheduler: Scheduler,
    pub stages: Vec<StageSnapshot>,
    pub latency: LatencySnapshot,
    pub workers_replaced: u64,
}

/// The registry of a pipeline's stages, and who runs them.
#[derive(Debug, Clone)]
pub struct Pipeline {
    budget: Arc<Budget>,
    scheduling: Scheduling,
    stages: Arc<Mutex<Vec<Arc<StageStats>>>>,
    /// Pool workers that died and were replaced, over the pipeline's life.
    replaced: Arc<AtomicU64>,
    /// Items' latencies from read to sink.
    latencies: Arc<Latencies>,
}

impl Pipeline {
    /// A pipeline whose CPU stages are run as `scheduling` says on `budget`'s tokens (its
    /// size is the pool's under [`Scheduler::Ordo`]).
    pub fn new(budget: Arc<Budget>, scheduling: Scheduling) -> Self {
        Self {
            budget,
            scheduling,
            stages: Arc::default(),
            replaced: Arc::default(),
            latencies: Arc::default(),
        }
    }

    /// Percentiles of the items' latencies from read to sink so far.
    pub fn latency(&self) -> LatencySnapshot {
        self.latencies.snapshot()
    }

    /// The items' latencies from read to sink so far, to add to others'.
    pub fn latencies(&self) -> &Latencies {
        &self.latencies
    }

    /// Everything the pipeline can tell about its run so far, for `--json` summaries.
    pub fn reading(&self) -> Reading {
        Reading {
            scheduler: self.scheduling.scheduler,
            stages: self.snapshot(),
            latency: self.latency(),
            workers_replaced: self.workers_replaced(),
        }
    }

    /// Readings of every stage, in the order they were added.
    pub fn snapshot(&self) -> Vec<StageSnapshot> {
        let stages = self.stages.lock();
        stages.iter().map(|s| s.snapshot()).collect()
    }

    /// Pool workers that died (a panic in a stage) and were replaced so far.
    pub fn workers_replaced(&self) -> u64 {
        self.replaced.load(Ordering::Relaxed)
    }

    /// Runs `body`, which starts the stages (first to last) and feeds the first; returns once
    /// every stage has ended.
    pub fn run<'env, T>(
        &'env self,
        body: impl for<'scope> FnOnce(&Stages<'scope, 'env>) -> T,
    ) -> T {
        std::thread::scope(|scope| {
            let wake = Arc::new(Wake::default());
            let Scheduling {
                scheduler,
                worker_kills,
            } = self.scheduling;
            let pool = (scheduler == Scheduler::Ordo).then(|| {
                let workers = self.budget.total() as usize;
                let replaced = self.replaced.clone();
                Arc::new(Pool::new(workers, wake.clone(), replaced, worker_kills))
            });
            let rayon = (scheduler == Scheduler::Rayon).then(|| {
                let threads = self.budget.total() as usize;
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("forte-rayon-{i}"))
                    .build()
                    .expect("starting rayon's thread pool");
                Arc::new(pool)
            });
            let stages = Stages {
                scope,
                pipeline: self,
                pool,
                rayon,
                wake,
            };
            let result = body(&stages);
            if let Some(pool) = &stages.pool {
                pool.close();
            }
            result
        })
    }

    /// Adds a stage's counters; its rank for the CPU budget is its position among the stages
    /// added so far.
    fn register<I: Weigh + Send + 'static>(
        &self,
        spec: StageSpec,
        input: &Receiver<I>,
    ) -> (Rank, Arc<StageStats>) {
        let probe = input.clone();
        let stats = Arc::new(StageStats {
            name: spec.name,
            item: I::ITEM,
            work: spec.work,
            workers: spec.workers,
            capacity: input.capacity().unwrap_or(0),
            depth: Box::new(move || probe.len()),
            items_in: AtomicU64::new(0),
            items_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            busy_nanos: AtomicU64::new(0),
            working_since: (0..spec.workers).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            busy_read: AtomicU64::new(0),
        });
        let mut stages = self.stages.lock();
        stages.push(stats.clone());
        (stages.len() - 1, stats)
    }
}

/// The stages of one run of a [`Pipeline`] ([`Pipeline::run`]), added first to last: a later
/// one is served first when the CPU is short.
pub struct Stages<'scope, 'env> {
    scope: &'scope Scope<'scope, 'env>,
    pipeline: &'env Pipeline,
    /// The CPU stages' workers under [`Scheduler::Ordo`].
    pool: Option<Arc<Pool<'scope>>>,
    /// Under [`Scheduler::Rayon`].
    rayon: Option<Arc<rayon::ThreadPool>>,
    wake: Arc<Wake>,
}

impl<'scope> Stages<'scope, '_> {
    /// A stage whose `workers` compute: `job` applied to every item of `input`, emitting
    /// results to `output` (at most one per item keeps the pool's reservations exact). Under
    /// [`Scheduler::Threads`] each worker holds a CPU token while it works. The stage ends when
    /// `input` is closed and drained; its output closes then.
    pub fn cpu<I, O, F>(
        &self,
        name: &'static str,
        workers: usize,
        input: Receiver<I>,
        output: Sender<O>,
        job: F,
    ) where
        I: Weigh + Salvage + Send + 'static,
        O: Weigh + Salvage<Remains = I::Remains> + Send + 'static,
        F: Fn(I, &mut Emit<'_, O>) + Send + Sync + 'scope,
    {
        let spec = StageSpec {
            name,
            work: Work::Cpu,
            workers: workers.max(1),
        };
        if let Some(pool) = &self.pool {
            let (rank, stats) = self.pipeline.register(spec, &input);
            pool.add(self.scope, rank, spec.workers, stats, input, output, job);
        } else if let Some(rayon) = &self.rayon {
            self.rayon_tasks(rayon.clone(), spec, input, output, job);
        } else {
            self.threads(spec, None, false, input, output, job);
        }
    }

    /// Under [`Scheduler::Rayon`]: a thread hands each item of the stage to rayon's pool as a
    /// task (a one-worker stage's it runs there itself, one at a time, in order).
    fn rayon_tasks<I, O, F>(
        &self,
        rayon: Arc<rayon::ThreadPool>,
        spec: StageSpec,
        input: Receiver<I>,
        output: Sender<O>,
        job: F,
    ) where
        I: Weigh + Send + 'static,
        O: Weigh + Send + 'static,
        F: Fn(I, &mut Emit<'_, O>) + Send + Sync + 'scope,
    {
        let (_, stats) = self.pipeline.register(spec, &input);
        let run = move |item: I| {
            let worker = rayon::current_thread_index().unwrap_or(0) % spec.workers;
            let mut emit = Emit::new(&output, &stats, worker);
            stats.took(&item);
            stats.start_work(worker);
            job(item, &mut emit);
            stats.stop_work(worker);
        };
        std::thread::Builder::new()
            .name(format!("forte-{}", spec.name))
            .spawn_scoped(self.scope, move || {
                let run = &run;
                rayon.in_place_scope(|tasks| {
                    for item in input.iter() {
                        if spec.workers == 1 {
                            rayon.install(|| run(item));
                        } else {
                            tasks.spawn(move |_| run(item));
                        }
                    }
                });
            })
            .expect("spawning a pipeline dispatcher thread");
    }

    /// A stage whose `workers` mostly wait on I/O (reading files, the network): each its own
    /// thread, outside the CPU budget.
    pub fn io<I, O, F>(
        &self,
        name: &'static str,
        workers: usize,
        input: Receiver<I>,
        output: Sender<O>,
        job: F,
    ) where
        I: Weigh + Send + 'static,
        O: Weigh + Send + 'static,
        F: Fn(I, &mut Emit<'_, O>) + Send + Sync + 'scope,
    {
        let spec = StageSpec {
            name,
            work: Work::Io,
            workers: workers.max(1),
        };
        // A stage before the pool's first feeds it: it reads when the pool wants an item.
        let feeds_pool = self.pool.as_ref().is_some_and(|p| p.is_empty());
        self.threads(spec, None, feeds_pool, input, output, job);
    }

    /// The last stage: `gate.max()` threads that consume every item of `input`, at most
    /// `gate.limit()` at once (a limit that may change while they run).
    pub fn sink<I, F>(&self, name: &'static str, gate: Arc<Gate>, input: Receiver<I>, job: F)
    where
        I: Weigh + Send + 'static,
        F: Fn(I) + Send + Sync + 'scope,
    {
        let (never_tx, _) = crossbeam_channel::bounded::<Done>(0);
        let spec = StageSpec {
            name,
            work: Work::Io,
            workers: gate.max(),
        };
        let gate = Some(gate);
        self.threads(spec, gate, false, input, never_tx, move |item, _| job(item));
    }

    /// Starts a stage's own threads, at most `gate`'s limit of them holding an item at once
    /// (`feeds_pool`: its items go to the pool, which says when it wants them).
    fn threads<I, O, F>(
        &self,
        spec: StageSpec,
        gate: Option<Arc<Gate>>,
        feeds_pool: bool,
        input: Receiver<I>,
        output: Sender<O>,
        job: F,
    ) where
        I: Weigh + Send + 'static,
        O: Weigh + Send + 'static,
        F: Fn(I, &mut Emit<'_, O>) + Send + Sync + 'scope,
    {
        let (rank, stats) = self.pipeline.register(spec, &input);
        let job = Arc::new(job);
        let budget = (spec.work == Work::Cpu).then(|| self.pipeline.budget.clone());
        // The pool's workers hear of every item taken or handed on.
        let wake = self.pool.as_ref().map(|_| self.wake.clone());
        // The sink times each item's way from read.
        let latencies = gate.as_ref().map(|_| self.pipeline.latencies.clone());
        let demand = self.pool.clone().filter(|_| feeds_pool);
        for worker in 0..spec.workers {
            let (input, output, stats, job, gate, budget, wake, latencies, demand) = (
                input.clone(),
                output.clone(),
                stats.clone(),
                job.clone(),
                gate.clone(),
                budget.clone(),
                wake.clone(),
                latencies.clone(),
                demand.clone(),
            );
            std::thread::Builder::new()
                .name(format!("forte-{}", spec.name))
                .spawn_scoped(self.scope, move || {
                    loop {
                        // A worker takes an item only with the gate's leave, so a lowered
                        // limit leaves items in the queue rather than in idle hands.
                        let pass = gate.as_ref().map(|g| g.enter());
                        let Ok(item) = input.recv() else { break };
                        if let Some(wake) = &wake {
                            wake.poke();
                        }
                        if let (Some(latencies), Some(read_at)) = (&latencies, item.read_at()) {
                            latencies.record(read_at.elapsed());
                        }
                        let _working = pass.map(GatePass::working);
                        stats.took(&item);
                        if let Some(b) = &budget {
                            b.acquire(1, rank);
                        }
                        stats.start_work(worker);
                        let mut emit = Emit {
                            budget: budget.as_deref(),
                            rank,
                            wake: wake.as_deref(),
                            demand: demand.as_deref().map(|p| p as &dyn Demand),
                            ..Emit::new(&output, &stats, worker)
                        };
                        job(item, &mut emit);
                        stats.stop_work(worker);
                        if let Some(b) = &budget {
                            b.release(1);
                        }
                    }
                    // Its output may close now: the pool's stages after it hear of it.
                    drop(output);
                    if let Some(wake) = &wake {
                        wake.poke();
                    }
                })
                .expect("spawning a pipeline worker thread");
        }
    }
}

/// How many of a stage's workers may hold an item at once: a limit below the number of
/// workers, changeable while they run (the send's tuner turns the uploads in flight with it).
///
/// It also keeps the integral over time of the workers holding an item, from which a reader
/// tells a stage that has all it may take (all its workers busy) from one short of work, and
/// how many items its workers have taken.
#[derive(Debug)]
pub struct Gate {
    state: Mutex<GateState>,
    freed: Condvar,
    max: usize,
}

#[derive(Debug)]
struct GateState {
    limit: usize,
    /// Workers let through, waiting for an item or working on one.
    passed: usize,
    /// Of those, the ones holding an item.
    working: usize,
    /// Seconds of `working` workers summed over time, up to `since`.
    working_seconds: f64,
    since: Instant,
    /// Items taken so far.
    taken: u64,
}

impl GateState {
    fn account(&mut self) {
        let now = Instant::now();
        self.working_seconds += self.working as f64 * (now - self.since).as_secs_f64();
        self.since = now;
    }
}

impl Gate {
    /// `limit` of `max` workers at once, the limit kept between 1 and `max`.
    pub fn new(limit: usize, max: usize) -> Arc<Self> {
        let max = max.max(1);
        Arc::new(Self {
            state: Mutex::new(GateState {
                limit: limit.clamp(1, max),
                passed: 0,
                working: 0,
                working_seconds: 0.0,
                since: Instant::now(),
                taken: 0,
            }),
            freed: Condvar::new(),
            max,
        })
    }

    /// All `workers` at once, always.
    pub fn fixed(workers: usize) -> Arc<Self> {
        Self::new(workers, workers)
    }

    /// The most workers there are, and so the highest limit.
    pub fn max(&self) -> usize {
        self.max
    }

    pub fn limit(&self) -> usize {
        self.state.lock().limit
    }

    /// Sets the limit (kept between 1 and [`Gate::max`]) and returns it. Workers above a
    /// lowered limit finish their item and then wait.
    pub fn set_limit(&self, limit: usize) -> usize {
        let limit = limit.clamp(1, self.max);
        self.state.lock().limit = limit;
        self.freed.notify_all();
        limit
    }

    /// Seconds of workers holding an item, summed over the gate's life: its difference over an
    /// interval divided by the interval is the mean number working.
    pub fn working_seconds(&self) -> f64 {
        let mut state = self.state.lock();
        state.account();
        state.working_seconds
    }

    /// Items its workers have taken so far.
    pub fn taken(&self) -> u64 {
        self.state.lock().taken
    }

    fn enter(&self) -> GatePass<'_> {
        let mut state = self.state.lock();
        while state.passed >= state.limit {
            self.freed.wait(&mut state);
        }
        state.passed += 1;
        GatePass {
            gate: self,
            working: false,
        }
    }
}

/// A worker's leave to take an item; given back when dropped.
struct GatePass<'a> {
    gate: &'a Gate,
    working: bool,
}

impl GatePass<'_> {
    /// The worker now holds an item.
    fn working(mut self) -> Self {
        let mut state = self.gate.state.lock();
        state.account();
        state.working += 1;
        state.taken += 1;
        self.working = true;
        drop(state);
        self
    }
}

impl Drop for GatePass<'_> {
    fn drop(&mut self) {
        let mut state = self.gate.state.lock();
        if self.working {
            state.account();
            state.working -= 1;
        }
        state.passed -= 1;
        drop(state);
        self.gate.freed.notify_one();
    }
}

/// The nothing a sink emits.
struct Done;

impl Weigh for Done {
    fn weight(&self) -> u64 {
        0
    }
}

/// A bounded queue between two stages.
pub fn queue<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    crossbeam_channel::bounded(capacity.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    impl Weigh for u64 {
        fn weight(&self) -> u64 {
            *self
        }
    }

    /// A lost item goes on as itself plus LOST.
    const LOST: u64 = 1_000_000;

    impl Salvage for u64 {
        type Remains = u64;

        fn remains(&self) -> u64 {
            *self
        }

        fn lost(remains: u64, _error: String) -> u64 {
            remains + LOST
        }
    }

    const ALL: [Scheduler; 3] = [Scheduler::Ordo, Scheduler::Threads, Scheduler::Rayon];

    fn on(scheduler: Scheduler) -> Scheduling {
        Scheduling {
            scheduler,
            worker_kills: None,
        }
    }

    #[test]
    fn items_flow_through_stages_and_counters_add_up() {
        for scheduler in ALL {
            let pipeline = Pipeline::new(Budget::new(2), on(scheduler));
            let (src_tx, src_rx) = queue::<u64>(2);
            let (mid_tx, mid_rx) = queue::<u64>(4);
            let (out_tx, out_rx) = queue::<u64>(2);
            let total = AtomicU64::new(0);
            pipeline.run(|s| {
                s.io("double", 3, src_rx, mid_tx, |x, emit| {
                    emit.send(x);
                    emit.send(x);
                });
                s.cpu("square", 2, mid_rx, out_tx, |x, emit| {
                    emit.send(x * x);
                });
                s.sink("sum", Gate::fixed(1), out_rx, |x| {
                    total.fetch_add(x, Ordering::Relaxed);
                });
                for i in 1..=100 {
                    src_tx.send(i).unwrap();
                }
                drop(src_tx);
            });
            let squares: u64 = (1..=100).map(|i| i * i).sum();
            assert_eq!(total.load(Ordering::Relaxed), 2 * squares, "{scheduler:?}");
            let snap = pipeline.snapshot();
            assert_eq!(snap[0].name, "double");
            assert_eq!((snap[0].items_in, snap[0].items_out), (100, 200));
            assert_eq!((snap[0].bytes_in, snap[0].bytes_out), (5050, 10100));
            assert_eq!((snap[1].items_in, snap[1].bytes_in), (200, 10100));
            assert_eq!((snap[2].items_in, snap[2].bytes_in), (200, 2 * squares));
            assert_eq!(snap[0].queue_capacity, 2);
        }
    }

    #[test]
    fn the_pool_runs_a_one_worker_stage_one_item_at_a_time_in_order() {
        // The raw hash: one file's parts in the order they were read.
        let pipeline = Pipeline::new(Budget::new(4), on(Scheduler::Ordo));
        let (tx, rx) = queue::<u64>(8);
        let (mid_tx, mid_rx) = queue::<u64>(8);
        let (out_tx, out_rx) = queue::<u64>(8);
        let (running, peak) = (AtomicU64::new(0), AtomicU64::new(0));
        let order = Mutex::new(vec![]);
        pipeline.run(|s| {
            s.cpu("hash", 1, rx, mid_tx, |x, emit| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(200));
                order.lock().push(x);
                running.fetch_sub(1, Ordering::SeqCst);
                emit.send(x);
            });
            s.cpu("work", 4, mid_rx, out_tx, |x, emit| {
                std::thread::sleep(Duration::from_micros(500));
                emit.send(x);
            });
            s.sink("drain", Gate::fixed(1), out_rx, |_| {});
            for i in 0..200 {
                tx.send(i).unwrap();
            }
            drop(tx);
        });
        assert_eq!(peak.load(Ordering::SeqCst), 1);
        assert_eq!(*order.lock(), (0..200).collect::<Vec<_>>());
    }

    #[test]
    fn a_worker_that_dies_is_replaced_and_its_item_goes_on_as_a_failure() {
        let pipeline = Pipeline::new(Budget::new(2), on(Scheduler::Ordo));
        let (tx, rx) = queue::<u64>(4);
        let (mid_tx, mid_rx) = queue::<u64>(4);
        let (out_tx, out_rx) = queue::<u64>(4);
        let seen = Mutex::new(vec![]);
        pipeline.run(|s| {
            s.cpu("fragile", 2, rx, mid_tx, |x, emit| {
                if x % 10 == 3 {
                    // A panic in a stage's job: its worker dies.
                    std::panic::resume_unwind(Box::new(format!("bad item {x}")));
                }
                emit.send(x);
            });
            s.cpu("pass", 2, mid_rx, out_tx, |x, emit| {
                emit.send(x);
            });
            s.sink("collect", Gate::fixed(1), out_rx, |x| seen.lock().push(x));
            for i in 0..50 {
                tx.send(i).unwrap();
            }
            drop(tx);
        });
        let mut seen = seen.into_inner();
        seen.sort();
        let expected: Vec<u64> = (0..50)
            .map(|i| if i % 10 == 3 { i + LOST } else { i })
            .collect();
        let mut expected = expected;
        expected.sort();
        assert_eq!(
            seen, expected,
            "every item arrives, the 5 lost ones as failures"
        );
        assert_eq!(pipeline.workers_replaced(), 5);
    }

    #[test]
    fn an_idle_pool_sleeps_until_woken_and_ends_when_its_source_does() {
        // A daemon between batches: the source waits 400 ms, then ends.
        let pipeline = Pipeline::new(Budget::new(2), on(Scheduler::Ordo));
        let (tx, rx) = queue::<u64>(4);
        let (mid_tx, mid_rx) = queue::<u64>(4);
        let (out_tx, out_rx) = queue::<u64>(4);
        let looks = pipeline.run(|s| {
            s.io("source", 1, rx, mid_tx, |x, emit| {
                emit.send(x);
            });
            s.cpu("work", 2, mid_rx, out_tx, |x, emit| {
                emit.send(x);
            });
            tx.send(1).unwrap();
            assert_eq!(out_rx.recv(), Ok(1));
            std::thread::sleep(Duration::from_millis(400));
            let looks = s.pool.as_ref().unwrap().looks();
            drop(tx);
            // The source's end reaches the pool at once (its output closing wakes it), not at
            // a worker's next look of its own.
            let closed = Instant::now();
            assert!(out_rx.recv().is_err());
            assert!(
                closed.elapsed() < Duration::from_millis(100),
                "{:?}",
                closed.elapsed()
            );
            looks
        });
        // Two workers idle for 400 ms looked a few times, not every few milliseconds (every
        // 2 ms: about 400 looks).
        assert!(looks < 20, "{looks} looks while idle");
    }

    #[test]
    fn workers_killed_on_a_schedule_lose_no_item() {
        let kills = "0.6,0.01".parse::<WorkerKills>().unwrap();
        let pipeline = Pipeline::new(
            Budget::new(2),
            Scheduling {
                scheduler: Scheduler::Ordo,
                worker_kills: Some(kills),
            },
        );
        let (tx, rx) = queue::<u64>(4);
        let (out_tx, out_rx) = queue::<u64>(4);
        let total = AtomicU64::new(0);
        pipeline.run(|s| {
            s.cpu("work", 2, rx, out_tx, |x, emit| {
                std::thread::sleep(Duration::from_millis(1));
                emit.send(x);
            });
            s.sink("sum", Gate::fixed(1), out_rx, |x| {
                total.fetch_add(x, Ordering::Relaxed);
            });
            for i in 1..=300 {
                tx.send(i).unwrap();
            }
            drop(tx);
        });
        // Killed before they touched their item: each was retried, none lost or failed.
        assert_eq!(total.load(Ordering::Relaxed), 300 * 301 / 2);
        assert!(
            pipeline.workers_replaced() >= 10,
            "{}",
            pipeline.workers_replaced()
        );
        assert!("0.6".parse::<WorkerKills>().is_err());
        assert!("2,4".parse::<WorkerKills>().is_err());
    }

    #[test]
    fn busy_time_counts_work_under_way_and_stops_when_idle() {
        let pipeline = Pipeline::new(Budget::new(2), on(Scheduler::Threads));
        let (tx, rx) = queue::<u64>(1);
        let (started_tx, started) = crossbeam_channel::bounded::<()>(1);
        let (finish, finished) = crossbeam_channel::bounded::<()>(0);
        let busy = || pipeline.snapshot()[0].busy_seconds;
        pipeline.run(|s| {
            s.sink("work", Gate::fixed(1), rx, |_| {
                started_tx.send(()).unwrap();
                // Working until told to stop.
                let deadline = Instant::now() + Duration::from_secs(5);
                while finished.try_recv().is_err() && Instant::now() < deadline {
                    std::hint::spin_loop();
                }
            });
            tx.send(1).unwrap();
            started.recv().unwrap();
            std::thread::sleep(Duration::from_millis(200));
            // One item, not finished: its time so far is busy time already.
            let during = busy();
            assert!(during >= 0.15, "busy {during} s while working for 0.2 s");
            finish.send(()).unwrap();
            drop(tx);
        });
        let after = busy();
        assert!(after >= 0.15, "{after}");
        // Idle since: no more busy time, and a reading never goes back.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(busy(), after);
    }

    #[test]
    fn a_gate_bounds_the_sink_workers_at_its_limit_as_it_changes() {
        let pipeline = Pipeline::new(Budget::new(1), on(Scheduler::Ordo));
        let gate = Gate::new(2, 8);
        let (tx, rx) = queue::<u64>(64);
        let (running, peak) = (AtomicU64::new(0), AtomicU64::new(0));
        let peak_after_raise = AtomicU64::new(0);
        pipeline.run(|s| {
            s.sink("upload", gate.clone(), rx, |x| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                let record = if x < 40 { &peak } else { &peak_after_raise };
                record.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(3));
                running.fetch_sub(1, Ordering::SeqCst);
            });
            for i in 0..40 {
                tx.send(i).unwrap();
            }
            while !tx.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(gate.set_limit(100), 8, "kept at the most workers there are");
            for i in 40..120 {
                tx.send(i).unwrap();
            }
            drop(tx);
        });
        assert_eq!(peak.load(Ordering::SeqCst), 2);
        assert!(peak_after_raise.load(Ordering::SeqCst) > 2);
        assert_eq!(gate.max(), 8);
        // 120 items of about 3 ms each were held by some worker for at least 0.36 s in all.
        assert!(gate.working_seconds() >= 0.36, "{}", gate.working_seconds());
        assert_eq!(gate.taken(), 120);
    }

    #[test]
    fn an_oversized_charge_takes_the_whole_budget_and_gives_it_back() {
        let budget = Budget::new(10);
        let big = budget.charge(25);
        assert_eq!(budget.free(), 0);
        drop(big);
        let (a, b) = (budget.charge(4), budget.charge(6));
        assert_eq!(budget.free(), 0);
        drop((a, b));
        assert_eq!(budget.free(), 10);
    }

    #[test]
    fn a_shrunk_charge_gives_back_the_difference_at_once_and_the_rest_when_dropped() {
        let budget = Budget::new(10);
        let mut part = budget.charge(8);
        part.shrink_to(3);
        assert_eq!(budget.free(), 7);
        // Growing is not what shrinking does: the charge stays at 3.
        part.shrink_to(5);
        assert_eq!(budget.free(), 7);
        let next = budget.charge(7);
        drop((part, next));
        assert_eq!(budget.free(), 10);
    }

    #[test]
    fn a_grown_budget_lets_a_waiting_charge_go_and_never_shrinks() {
        let budget = Budget::new(10);
        let held = budget.charge(10);
        let waiter = {
            let budget = budget.clone();
            std::thread::spawn(move || budget.charge(5))
        };
        budget.grow_to(15);
        let more = waiter.join().expect("the waiter got its 5 units");
        assert_eq!(budget.free(), 0);
        budget.grow_to(12);
        drop((held, more));
        assert_eq!(budget.free(), 15);
    }

    #[test]
    fn cpu_budget_bounds_concurrent_workers() {
        for scheduler in ALL {
            let pipeline = Pipeline::new(Budget::new(2), on(scheduler));
            let (tx, rx) = queue::<u64>(8);
            let (mid_tx, mid_rx) = queue::<u64>(8);
            let (out_tx, out_rx) = queue::<u64>(8);
            let running = AtomicU64::new(0);
            let peak = AtomicU64::new(0);
            let work = |x, emit: &mut Emit<'_, u64>| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
                running.fetch_sub(1, Ordering::SeqCst);
                emit.send(x);
            };
            pipeline.run(|s| {
                s.cpu("work", 6, rx, mid_tx, work);
                s.cpu("more", 6, mid_rx, out_tx, work);
                s.sink("drain", Gate::fixed(1), out_rx, |_| {});
                for i in 0..60 {
                    tx.send(i).unwrap();
                }
                drop(tx);
            });
            assert_eq!(peak.load(Ordering::SeqCst), 2, "{scheduler:?}");
        }
    }

    #[test]
    fn a_token_goes_to_the_waiter_furthest_down_the_pipeline() {
        let budget = Budget::new(1);
        let held = budget.charge(1);
        let order = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for (waiting, rank) in [0, 2, 1].into_iter().enumerate() {
                let (budget, order) = (&budget, &order);
                s.spawn(move || {
                    budget.acquire(1, rank);
                    order.lock().push(rank);
                    budget.release(1);
                });
                // Each waits before the next comes, so arrival order is 0, 2, 1.
                while budget.units.lock().waiting.len() <= waiting {
                    std::thread::yield_now();
                }
            }
            drop(held);
        });
        assert_eq!(*order.lock(), [2, 1, 0]);
    }
}
