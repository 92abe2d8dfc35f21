//! The pipelines' stages as Prometheus families and dashboard rows: read from the running
//! pipelines at each scrape (a queue shows how full it is now, busy time grows while an item
//! is worked on), with the totals of those that ended kept.

use std::collections::BTreeMap;
use std::time::Duration;

use forte_catalog::Role;
use forte_pipeline::{Latencies, Pipeline, StageSnapshot};
use forte_view::StageView;
use parking_lot::Mutex;

/// A stage of a role: (role, stage).
type StageKey = (&'static str, &'static str);

/// A pipeline running now, under the id [`while_running`] gave it.
struct Running {
    id: u64,
    role: Role,
    pipeline: Pipeline,
}

/// A role's pool: its items' latencies and the workers replaced.
#[derive(Default)]
struct PoolTotals {
    latencies: Latencies,
    replaced: u64,
}

/// The pipelines running now, and the totals of those that ended, per role and stage.
#[derive(Default)]
struct Stages {
    running: Vec<Running>,
    next: u64,
    ended: BTreeMap<StageKey, StageTotals>,
    /// Per role: the items' latencies and the pool workers replaced, of the pipelines that
    /// ended.
    ended_pools: BTreeMap<&'static str, PoolTotals>,
}

impl Stages {
    /// Adds the running pipelines' stages, read now, to `totals`: pipelines of one role
    /// running at once add up stage by stage, and a stage not in `totals` yet comes after
    /// those that are, in pipeline order.
    fn add_running(&self, totals: &mut Vec<(StageKey, StageTotals)>) {
        for Running { role, pipeline, .. } in &self.running {
            for st in pipeline.snapshot() {
                let key = (role.as_str(), st.name);
                let at = match totals.iter().position(|(k, _)| *k == key) {
                    Some(at) => at,
                    None => {
                        totals.push((key, StageTotals::default()));
                        totals.len() - 1
                    }
                };
                totals[at].1.add(&st, true);
            }
        }
    }

    /// Per role, of every pipeline, ended or running: the items' latencies and the pool
    /// workers replaced.
    fn pools(&self) -> BTreeMap<&'static str, PoolTotals> {
        let mut pools: BTreeMap<&'static str, PoolTotals> = BTreeMap::new();
        let ended = self
            .ended_pools
            .iter()
            .map(|(r, p)| (*r, &p.latencies, p.replaced));
        let running = self.running.iter().map(|r| {
            (
                r.role.as_str(),
                r.pipeline.latencies(),
                r.pipeline.workers_replaced(),
            )
        });
        for (role, latencies, replaced) in ended.chain(running) {
            let pool = pools.entry(role).or_default();
            pool.latencies.add(latencies);
            pool.replaced += replaced;
        }
        pools
    }
}

/// What a stage did, summed over its pipelines.
#[derive(Default, Clone, Copy)]
struct StageTotals {
    /// What the stage's items are (`object`, `part`).
    item: &'static str,
    /// Of the running pipelines only: their workers and queues now.
    workers: usize,
    queue_depth: usize,
    queue_capacity: usize,
    items: u64,
    bytes_in: u64,
    bytes_out: u64,
    busy_seconds: f64,
}

impl StageTotals {
    fn add(&mut self, st: &StageSnapshot, running: bool) {
        self.item = st.item;
        if running {
            self.workers += st.workers;
            self.queue_depth += st.queue_depth;
            self.queue_capacity += st.queue_capacity;
        }
        self.items += st.items_in;
        self.bytes_in += st.bytes_in;
        self.bytes_out += st.bytes_out;
        self.busy_seconds += st.busy_seconds;
    }

    /// Input bytes per busy second of one worker.
    fn service_rate(&self) -> f64 {
        if self.busy_seconds > 0.0 {
            self.bytes_in as f64 / self.busy_seconds
        } else {
            0.0
        }
    }
}

static STAGES: Mutex<Option<Stages>> = Mutex::new(None);

/// A stage family: its name, type, help text, and its value of a stage's totals.
struct StageFamily {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&StageTotals) -> f64,
}

/// The stages' families in Prometheus' text format, read now: queue depths as they are, and
/// busy time with the work under way (in seconds).
pub(super) fn stage_families() -> String {
    let mut totals = vec![];
    let mut pools = BTreeMap::new();
    if let Some(stages) = STAGES.lock().as_ref() {
        totals.extend(stages.ended.iter().map(|(key, t)| (*key, *t)));
        stages.add_running(&mut totals);
        pools = stages.pools();
    }
    let families: [StageFamily; 6] = [
        StageFamily {
            name: "forte_stage_queue_depth",
            kind: "gauge",
            help: "Items waiting in a pipeline stage's input queue",
            value: |t| t.queue_depth as f64,
        },
        StageFamily {
            name: "forte_stage_items_total",
            kind: "counter",
            help: "Items that entered a pipeline stage, in the unit its label item says (object: a file or a bundle; part)",
            value: |t| t.items as f64,
        },
        StageFamily {
            name: "forte_stage_bytes_in_total",
            kind: "counter",
            help: "Bytes that entered a pipeline stage",
            value: |t| t.bytes_in as f64,
        },
        StageFamily {
            name: "forte_stage_bytes_out_total",
            kind: "counter",
            help: "Bytes a pipeline stage passed on",
            value: |t| t.bytes_out as f64,
        },
        StageFamily {
            name: "forte_stage_busy_seconds_total",
            kind: "counter",
            help: "Time a stage's workers spent on items, summed over workers, work under way included",
            value: |t| t.busy_seconds,
        },
        StageFamily {
            name: "forte_stage_service_rate_bytes_per_second",
            kind: "gauge",
            help: "Input bytes a stage handles per busy second of one worker",
            value: StageTotals::service_rate,
        },
    ];
    let mut text = String::new();
    for StageFamily {
        name,
        kind,
        help,
        value,
    } in families
    {
        if totals.is_empty() {
            break;
        }
        text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for ((role, stage), t) in &totals {
            // The items' unit goes with their count.
            let item = match name {
                "forte_stage_items_total" => format!(",item=\"{}\"", t.item),
                _ => String::new(),
            };
            text.push_str(&format!(
                "{name}{{role=\"{role}\",stage=\"{stage}\"{item}}} {}\n",
                value(t)
            ));
        }
    }
    pool_families(&pools, &mut text);
    text
}

/// The latency from read to sink of every part of `role`'s pipelines in this process so far.
pub fn item_latency(role: Role) -> forte_catalog::ItemLatency {
    let pools = STAGES
        .lock()
        .as_ref()
        .map(Stages::pools)
        .unwrap_or_default();
    pools
        .get(role.as_str())
        .map_or_else(Default::default, |pool| {
            let l = pool.latencies.snapshot();
            forte_catalog::ItemLatency {
                items: l.items as i64,
                p50_ms: l.p50_ms,
                p87_ms: l.p87_ms,
                p99_ms: l.p99_ms,
            }
        })
}

/// The items' latency from read to sink (a summary: p50, p87, p99) and the pool workers
/// replaced, per role.
fn pool_families(pools: &BTreeMap<&'static str, PoolTotals>, text: &mut String) {
    if pools.is_empty() {
        return;
    }
    let name = "forte_item_latency_seconds";
    text.push_str(&format!(
        "# HELP {name} Time from an item's (a part's) read to the sink taking it\n# TYPE {name} summary\n"
    ));
    for (role, pool) in pools {
        let l = pool.latencies.snapshot();
        for (quantile, ms) in [("0.5", l.p50_ms), ("0.87", l.p87_ms), ("0.99", l.p99_ms)] {
            let seconds = ms / 1e3;
            text.push_str(&format!(
                "{name}{{role=\"{role}\",quantile=\"{quantile}\"}} {seconds}\n"
            ));
        }
        text.push_str(&format!(
            "{name}_sum{{role=\"{role}\"}} {}\n",
            l.sum_seconds
        ));
        text.push_str(&format!("{name}_count{{role=\"{role}\"}} {}\n", l.items));
    }
    let name = "forte_pool_workers_replaced_total";
    text.push_str(&format!(
        "# HELP {name} Pool workers that died (a panic in a stage) and were replaced\n# TYPE {name} counter\n"
    ));
    for (role, pool) in pools {
        let replaced = pool.replaced;
        text.push_str(&format!("{name}{{role=\"{role}\"}} {replaced}\n"));
    }
}

/// Runs `work` while `pipeline`'s stages are read at each scrape, and `also` publishes once
/// a second (and once more at the end). What the pipeline did stays counted after it ends.
pub fn while_running<R>(
    role: Role,
    pipeline: &Pipeline,
    also: impl Fn() + Sync,
    work: impl FnOnce() -> R,
) -> R {
    let id = {
        let mut stages = STAGES.lock();
        let stages = stages.get_or_insert_with(Stages::default);
        stages.next += 1;
        let id = stages.next;
        stages.running.push(Running {
            id,
            role,
            pipeline: pipeline.clone(),
        });
        stages.next
    };
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let result = std::thread::scope(|s| {
        let also = &also;
        s.spawn(move || loop {
            let last = finished.recv_timeout(Duration::from_secs(1))
                != Err(std::sync::mpsc::RecvTimeoutError::Timeout);
            also();
            if last {
                break;
            }
        });
        let result = work();
        drop(done);
        result
    });
    let mut stages = STAGES.lock();
    let stages = stages.get_or_insert_with(Stages::default);
    stages.running.retain(|running| running.id != id);
    for st in pipeline.snapshot() {
        let key = (role.as_str(), st.name);
        stages.ended.entry(key).or_default().add(&st, false);
    }
    let pool = stages.ended_pools.entry(role.as_str()).or_default();
    pool.latencies.add(pipeline.latencies());
    pool.replaced += pipeline.workers_replaced();
    result
}

/// The running pipelines' stages as the dashboard shows them.
pub(super) fn running_views() -> Vec<StageView> {
    let mut running = vec![];
    if let Some(stages) = STAGES.lock().as_ref() {
        stages.add_running(&mut running);
    }
    running
        .into_iter()
        .map(|((role, stage), t)| StageView {
            role: Role::parse(role).expect("a role's own text"),
            stage,
            item: t.item,
            workers: t.workers,
            queue_depth: t.queue_depth,
            queue_capacity: t.queue_capacity,
            fill: if t.queue_capacity > 0 {
                (t.queue_depth as f64 / t.queue_capacity as f64).min(1.0)
            } else {
                0.0
            },
            items: t.items,
            bytes_in: t.bytes_in,
            bytes_out: t.bytes_out,
            busy_s: t.busy_seconds,
            service_rate_bytes_per_second: t.service_rate(),
        })
        .collect()
}
