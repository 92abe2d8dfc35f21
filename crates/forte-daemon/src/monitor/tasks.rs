//! The site's tasks as Prometheus families: tries by outcome, and the seconds they waited for a
//! slot and ran (fractional, which the metrics crate's counters are not).

use std::collections::BTreeMap;

use parking_lot::Mutex;

/// A try of the site's task `task` ended with `outcome`, after waiting `queued` seconds for a
/// slot and running `busy`.
pub fn task_try(task: &str, outcome: forte_catalog::TaskOutcome, queued: f64, busy: f64) {
    let mut tasks = TASKS.lock();
    let totals = tasks.entry(task.to_owned()).or_default();
    *totals.tries.entry(outcome.as_str()).or_default() += 1;
    totals.queued_seconds += queued.max(0.0);
    totals.busy_seconds += busy.max(0.0);
}

/// Per site task: its tries by outcome, and the seconds they waited for a slot and ran.
#[derive(Default)]
struct TaskTotals {
    tries: BTreeMap<&'static str, u64>,
    queued_seconds: f64,
    busy_seconds: f64,
}

static TASKS: Mutex<BTreeMap<String, TaskTotals>> = Mutex::new(BTreeMap::new());

/// A task family: its name, help text, and its value of a task's totals.
struct TaskFamily {
    name: &'static str,
    help: &'static str,
    value: fn(&TaskTotals) -> f64,
}

/// The site's tasks' families in Prometheus' text format (seconds are fractional, which the
/// metrics crate's counters are not).
pub(super) fn task_families() -> String {
    let tasks = TASKS.lock();
    if tasks.is_empty() {
        return String::new();
    }
    let mut text = String::new();
    let name = "forte_task_tries_total";
    let help = "Tries of the site's own tasks ([[task]]), by outcome";
    text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
    for (task, t) in tasks.iter() {
        for (outcome, n) in &t.tries {
            text.push_str(&format!(
                "{name}{{task=\"{task}\",outcome=\"{outcome}\"}} {n}\n"
            ));
        }
    }
    let seconds: [TaskFamily; 2] = [
        TaskFamily {
            name: "forte_task_queue_seconds_total",
            help: "Time the tries of a site's own task waited for one of its slots",
            value: |t| t.queued_seconds,
        },
        TaskFamily {
            name: "forte_task_busy_seconds_total",
            help: "Time the tries of a site's own task ran",
            value: |t| t.busy_seconds,
        },
    ];
    for TaskFamily { name, help, value } in seconds {
        text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
        for (task, t) in tasks.iter() {
            text.push_str(&format!("{name}{{task=\"{task}\"}} {}\n", value(t)));
        }
    }
    text
}
