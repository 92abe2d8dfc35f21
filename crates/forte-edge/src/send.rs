//! `send`'s entry point: the inbox locked, the relay connected, the edge built from the
//! resolved settings, then one pass over the ready batches, a daemon that watches the inbox
//! until stopped, or the cancellation of named batches.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use forte_catalog::{BatchState, Role};
use forte_daemon::record::{sample_usage, Catalog};
use forte_daemon::settings::{self, Config, SendCommand, SendSettings};
use forte_daemon::{monitor, signals};

use crate::{ready_batches, Batch, Edge, EdgeSetup, Inbox, InboxLock, SendReport};

/// What a `send` did.
pub enum Sent {
    /// One pass over the ready batches.
    Pass(PassReport),
    /// Watching ended on a stop, every batch admitted sent and sealed.
    Stopped,
    /// `--cancel`: what became of each batch named.
    Cancelled(Vec<crate::Cancelled>),
}

/// One pass's outcome, for the command to print.
pub struct PassReport {
    /// The batches sent, in inbox order.
    pub batches: Vec<SendReport>,
    /// Batches cancelled before, skipped.
    pub cancelled: Vec<String>,
    /// Batches a site task refused, now or before: not sent.
    pub refused: Vec<String>,
    /// Batches not ready yet (changed within the settle time, no marker).
    pub waiting: Vec<String>,
    /// How long a batch without a marker must stay unchanged to be ready.
    pub settle: Duration,
    pub seconds: f64,
}

impl PassReport {
    /// Every file of every batch went, and no task refused a batch.
    pub fn ok(&self) -> bool {
        self.batches.iter().all(|b| b.failed == 0) && self.refused.is_empty()
    }

    /// The pass for the operator, one line each: the cancelled batches, those sent, the
    /// totals, then those refused and those still waiting, each with what sends it again.
    pub fn text(&self) -> String {
        use crate::READY_MARKER;
        use forte_daemon::units::{human, mb_per_s};
        let mut lines: Vec<String> = self
            .cancelled
            .iter()
            .map(|name| {
                format!("batch {name}: cancelled; touch its {READY_MARKER} marker to send it again")
            })
            .collect();
        lines.extend(self.batches.iter().map(SendReport::text));
        let raw: u64 = self.batches.iter().map(|b| b.raw_bytes).sum();
        let sealed: u64 = self.batches.iter().map(|b| b.sealed_bytes).sum();
        lines.push(format!(
            "sent {} batches: {} raw as {} sealed in {:.1} s ({:.1} MB/s raw)",
            self.batches.len(),
            human(raw),
            human(sealed),
            self.seconds,
            mb_per_s(raw, self.seconds)
        ));
        lines.extend(self.refused.iter().map(|name| {
            format!("batch {name}: refused by a site task, not sent (forte status says why); touch its {READY_MARKER} marker to check and send it again")
        }));
        lines.extend(self.waiting.iter().map(|name| {
            format!(
                "batch {name}: not ready (changed in the last {} s and no {READY_MARKER} marker)",
                self.settle.as_secs()
            )
        }));
        lines.join("\n")
    }
}

/// How a `send` reports as it goes.
pub struct SendOutput {
    /// No progress bars.
    pub quiet: bool,
    /// Told of each batch's report as it finishes, while watching.
    pub on_finished: fn(&SendReport),
}

/// What a watching sender stopped by a signal leaves to its next start, in words (for
/// [`signals::install`], which its command calls before the sender starts).
pub const LEFT_AT_STOP: &str =
    "what was not uploaded is sent at the next start, which asks the relay what it holds";

/// Runs `send`: takes the inbox's lock (waiting for the inbox to exist while watching) before
/// anything else, so that a second send on the same inbox names the first whatever else is
/// wrong with it; then resolves the settings and cancels, sends once, or watches until stopped.
pub fn send(
    flags: SendCommand,
    config: &Config,
    catalog: &Catalog,
    output: SendOutput,
) -> Result<Sent> {
    let _inbox = if flags.daemon.watch {
        let Some(lock) = InboxLock::take_when_there(flags.inbox, flags.daemon.interval())? else {
            tracing::info!(
                "stopped ({}) while waiting for the inbox {}: nothing was sent",
                signals::which(),
                flags.inbox.display()
            );
            return Ok(Sent::Stopped);
        };
        lock
    } else {
        InboxLock::take(flags.inbox)?
    };
    let settings = settings::send(flags, config)?;
    send_locked(settings, catalog, output)
}

/// `send` once the inbox is this process's.
fn send_locked(settings: SendSettings, catalog: &Catalog, output: SendOutput) -> Result<Sent> {
    let s = settings;
    let _usage = sample_usage(catalog, Role::Edge);
    let mut client = s
        .relay
        .connect()?
        .uploading(s.edge.prepare.sink.max(), s.pacer.clone());
    if s.daemon.http.is_some() {
        // The dashboard follows each upload as it goes, for its rate and ETA.
        client = client.telling_sent(Arc::new(monitor::part_sending_bytes));
    }
    let order = s.policy.eta_order();
    let edge = Edge::new(EdgeSetup {
        client: &client,
        site: s.site,
        receipts: s.receipts,
        settings: &s.edge,
        retry: s.daemon.retry(),
        catalog,
        policy: s.policy,
        failures: s.daemon.failures.clone(),
        on_finished: s.daemon.watch.then_some(output.on_finished),
        tune: s.tune,
        tasks: s.tasks,
    });
    if !s.cancel.is_empty() {
        return edge.cancel(&s.inbox, &s.cancel).map(Sent::Cancelled);
    }
    if let Some(http) = s.daemon.http.clone() {
        let progress = monitor::Progress {
            part_size: s.edge.prepare.part_size,
            order,
        };
        monitor::serve(http, Role::Edge, catalog, progress)?;
    }
    monitor::publish_etas(Role::Edge, catalog, s.edge.prepare.part_size, order);
    if s.daemon.watch {
        let watch = Watch {
            edge: &edge,
            inbox: &s.inbox,
            settle: s.settle,
            interval: s.daemon.interval,
            delete_after_ack: s.delete_after_ack,
        };
        signals::install(LEFT_AT_STOP);
        signals::end_after_grace(s.daemon.shutdown_grace);
        watch.run();
        Ok(Sent::Stopped)
    } else {
        once(&edge, &s.inbox, s.settle, output.quiet).map(Sent::Pass)
    }
}

/// Sends `batches` in one pass; their reports. The relay is asked what it held of the new
/// ones while they are sent.
fn send_batches(edge: &Edge, batches: &[Batch], quiet: bool) -> Vec<SendReport> {
    // Nothing to send, nothing to connect to: an unreachable relay does not hold up a run with
    // nothing to do (the tuner's first round trip waited out the request timeout).
    if batches.is_empty() {
        return Vec::new();
    }
    std::thread::scope(|s| {
        // The connections open while the batches are discovered and their first files
        // prepared; the status query and the uploads then go on them together.
        let opening = edge.opening_connections();
        let opening = s.spawn(move || opening.open());
        let unasked = edge.admit(batches);
        edge.close();
        s.spawn(move || {
            let _ = opening.join();
            edge.ask_relay(unasked);
        });
        edge.send_queued(quiet);
    });
    edge.take_finished()
}

/// Sends the ready batches of `inbox` once.
fn once(edge: &Edge, inbox: &Path, settle: Duration, quiet: bool) -> Result<PassReport> {
    let started = Instant::now();
    let Inbox { mut ready, waiting } = ready_batches(inbox, settle)?;
    // A batch an edge task refused (now or before) is not sent, and fails the run.
    let (mut refused, mut cancelled) = (Vec::new(), Vec::new());
    ready.retain(|b| {
        let held = edge.held_back(b);
        match held {
            Some(BatchState::Refused) => refused.push(b.name.clone()),
            Some(_) => cancelled.push(b.name.clone()),
            None => {}
        }
        held.is_none()
    });
    let mut batches = send_batches(edge, &ready, quiet);
    refused.extend(
        ready
            .iter()
            .filter(|b| !batches.iter().any(|r| r.batch == b.name))
            .filter(|b| edge.held_back(b) == Some(BatchState::Refused))
            .map(|b| b.name.clone()),
    );
    // Batches the relay held some of already, from a run this catalogue has no record of, go
    // once more: their files are in the catalogue now, so the relay is asked first.
    let again: Vec<Batch> = ready
        .into_iter()
        .filter(|b| batches.iter().any(|r| r.send_again && r.batch == b.name))
        .collect();
    if !again.is_empty() {
        batches.retain(|r| !r.send_again);
        edge.reopen();
        batches.extend(send_batches(edge, &again, quiet));
    }
    // Reported in inbox order, whatever order the policy finished them in.
    batches.sort_by(|a, b| a.batch.cmp(&b.batch));
    Ok(PassReport {
        batches,
        cancelled,
        refused,
        waiting,
        settle,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A watching `send`: the inbox scanned every interval and what is ready sent, until stopped.
struct Watch<'a> {
    edge: &'a Edge<'a>,
    inbox: &'a Path,
    settle: Duration,
    interval: Duration,
    delete_after_ack: bool,
}

impl Watch<'_> {
    fn run(&self) {
        tracing::info!("watching {} every {} s (Ctrl-C or SIGTERM stops after the batches under way; a restart resumes where this left off)",
            self.inbox.display(),
            self.interval.as_secs()
        );
        let edge = self.edge;
        std::thread::scope(|s| {
            s.spawn(|| {
                while !signals::stop_requested() {
                    self.scan();
                    signals::sleep_unless_stopped(self.interval);
                }
                // Stopping: no batch is admitted any more; the pass below ends once the
                // batches admitted are sent and sealed.
                edge.close();
            });
            // The queue stays open while watching: a pass ends only when a failure stops it
            // (then its unfinished batches are admitted again by the next scan) or on a stop.
            loop {
                edge.send_queued(true);
                if signals::stop_requested() {
                    tracing::info!(
                        "stopped ({}): every batch admitted was sent and sealed; a restart resumes",
                        signals::which()
                    );
                    return;
                }
                signals::sleep_unless_stopped(self.interval);
            }
        })
    }

    /// One look at the inbox: lost uploads found, ready batches admitted, the relay asked,
    /// acknowledged batches deleted.
    fn scan(&self) {
        let edge = self.edge;
        if signals::take_reload() {
            tracing::info!(
                "SIGHUP: send reads its settings when it starts; restart it to change them"
            );
        }
        edge.find_lost();
        match ready_batches(self.inbox, self.settle) {
            Ok(found) => {
                edge.clear("");
                let todo: Vec<Batch> = found
                    .ready
                    .into_iter()
                    .filter(|b| edge.needs_sending(b))
                    .collect();
                let unasked = std::thread::scope(|s| {
                    if !todo.is_empty() {
                        let opening = edge.opening_connections();
                        s.spawn(move || opening.open());
                    }
                    edge.admit(&todo)
                });
                edge.ask_relay(unasked);
            }
            Err(e) => edge.fail("", None, &format!("{e:#}")),
        }
        if self.delete_after_ack {
            edge.delete_acknowledged(self.inbox);
        }
        edge.take_finished();
    }
}
