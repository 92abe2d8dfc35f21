//! `forte send`: the ready batches of an inbox, prepared and uploaded to the relay in one
//! streaming pass, in the order of the queue policy, each sealed at the relay as soon as its
//! last file is.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use forte_catalog::{BatchState, Role};
use serde::Serialize;

use super::{Daemon, Output};
use forte_daemon::failures::Failures;
use forte_daemon::record::Catalog;
use forte_daemon::retry::Retry;
use forte_daemon::settings::{self, Config, Connections, EdgeFlags, RelayFlags, ScheduleFlags};
use forte_daemon::signals;
use forte_daemon::tasks::Point;
use forte_daemon::units::{human, mb_per_s};
use forte_edge::{
    ready_batches, Batch, Edge, EdgeSetup, Inbox, InboxLock, SendReport, READY_MARKER,
};

#[derive(clap::Args)]
pub struct Args {
    /// Inbox directory: each subdirectory is one batch.
    inbox: PathBuf,
    #[command(flatten)]
    relay: RelayFlags,
    #[command(flatten)]
    edge: EdgeFlags,
    /// Seconds without any change after which a batch without a .ready marker is complete.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    settle: u64,
    /// Uploads in flight to the relay. auto starts from this relay's history (per size of
    /// request and hour of day), else from the measured round trip, and is tuned on the
    /// goodput while the transfer runs (every 2 s, or longer until 8 requests went out), each
    /// change logged with its reason; a number fixes it [config: send.connections]
    /// [default: auto].
    #[arg(long, value_name = "N|auto")]
    connections: Option<Connections>,
    /// Hold the upload at this rate (30MB, 240mbit) by pacing every upload, never by letting
    /// requests time out; under a --bwlimit timetable, the lower of the two holds
    /// [config: send.target_rate].
    #[arg(long, value_name = "RATE")]
    target_rate: Option<String>,
    /// Upload bandwidth limit, held by pacing every upload (never by letting requests time
    /// out): a rate (20MB, 160mbit), off, or a weekly timetable in local time,
    /// "08:00,2MB 19:00,off" or "Mon-08:00,2MB Sat-00:00,off" [config: send.bwlimit] [default: off].
    #[arg(long, value_name = "RATE|TIMETABLE")]
    bwlimit: Option<String>,
    /// With --watch: delete a batch's source files once the core's signed custody receipt
    /// (checked with --receipt-pub) lists every one with the SHA-256 its bytes still have.
    #[arg(long, requires = "watch")]
    delete_after_ack: bool,
    /// The core's receipt key (receipt.pub from `forte keygen`); repeat for several cores.
    /// --delete-after-ack deletes only under receipts signed by one of them
    /// [config: keys.receipt_pub].
    #[arg(long, value_name = "FILE")]
    receipt_pub: Vec<PathBuf>,
    /// This edge's site, signed into every batch so the core files it under no other site
    /// [config: send.site] [default: the relay's name for this token, asked before the first
    /// batch is prepared]. Give it when several sites share an edge key: then a relay that
    /// lies about it is refused at the core.
    #[arg(long, value_name = "NAME")]
    site: Option<String>,
    /// Cancel this batch (a directory name of the inbox; repeatable) instead of sending: the
    /// relay deletes what it holds of it that the core has not taken, so the core never gets
    /// it, and later runs skip it. The source is untouched; touch its .ready marker to send it
    /// again. For a batch too large for the relay, or sent by mistake.
    #[arg(long, value_name = "BATCH", conflicts_with_all = ["watch", "delete_after_ack"])]
    cancel: Vec<String>,
    #[command(flatten)]
    schedule: ScheduleFlags,
    #[command(flatten)]
    daemon: Daemon,
    #[command(flatten)]
    output: Output,
}

#[derive(Serialize)]
struct Summary {
    command: &'static str,
    batches: Vec<SendReport>,
    waiting: Vec<String>,
}

pub fn run(args: Args, config: &Config, catalog: &Catalog) -> Result<bool> {
    let _inbox = if args.daemon.watch {
        InboxLock::take_when_there(
            &args.inbox,
            Duration::from_secs(args.daemon.interval.max(1)),
        )?
    } else {
        InboxLock::take(&args.inbox)?
    };
    let link = settings::relay(&args.relay, config)?;
    let mut edge_settings = settings::edge(&args.edge, config)?;
    let (uploads, tune) = settings::uploads(args.connections, config);
    edge_settings.prepare.sink = uploads;
    let policy = settings::policy(&args.schedule, config)?;
    let order = policy.eta_order();
    let _usage = forte_daemon::record::sample_usage(catalog, Role::Edge);
    let pacer =
        settings::upload_pacer(args.bwlimit.as_deref(), args.target_rate.as_deref(), config)?;
    let http = settings::http(&args.daemon.http, config, None)?;
    let mut client = link
        .connect()?
        .uploading(edge_settings.prepare.sink.max(), pacer);
    if http.is_some() {
        // The dashboard follows each upload as it goes, for its rate and ETA.
        client = client.telling_sent(Arc::new(forte_daemon::monitor::part_sending_bytes));
    }
    let receipts = settings::receipt_pub(&args.receipt_pub, config)?;
    if args.delete_after_ack && receipts.is_none() {
        bail!("--delete-after-ack needs the core's receipt key (--receipt-pub keys/receipt.pub, or keys.receipt_pub): without it, the relay's word alone would delete sources");
    }
    let site = settings::EdgeSite::new(args.site.as_deref(), config)?;
    let edge = Edge::new(EdgeSetup {
        client: &client,
        site,
        receipts,
        settings: &edge_settings,
        retry: if args.daemon.watch {
            Retry::forever()
        } else {
            Retry::one_shot()
        },
        catalog,
        policy,
        failures: Failures {
            role: Role::Edge,
            command: args.daemon.on_failure.clone(),
        },
        on_finished: args.daemon.watch.then_some(print_report as fn(&SendReport)),
        tune,
        tasks: settings::tasks(config, &[Point::Edge])?,
    });
    if !args.cancel.is_empty() {
        return edge.cancel(&args.inbox, &args.cancel);
    }
    if let Some(http) = http {
        let part_size = edge_settings.prepare.part_size;
        forte_daemon::monitor::serve(http, Role::Edge, catalog, (part_size, order))?;
    }
    let pass = Pass {
        edge: &edge,
        settle: Duration::from_secs(args.settle),
    };
    if args.daemon.watch {
        pass.watch(&args)
    } else {
        pass.once(&args)
    }
}

/// One run's edge and how long a batch without a marker must stay unchanged.
struct Pass<'a> {
    edge: &'a Edge<'a>,
    settle: Duration,
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

impl Pass<'_> {
    /// Sends the ready batches once and reports them; true when every file went.
    fn once(&self, args: &Args) -> Result<bool> {
        let (edge, settle) = (self.edge, self.settle);
        let started = Instant::now();
        let Inbox { mut ready, waiting } = ready_batches(&args.inbox, settle)?;
        // A batch an edge task refused (now or before) is not sent, and fails the run.
        let mut refused = Vec::new();
        ready.retain(|b| {
            let held = edge.held_back(b);
            match held {
                Some(BatchState::Refused) => refused.push(b.name.clone()),
                Some(_) => println!(
                    "batch {}: cancelled; touch its {READY_MARKER} marker to send it again",
                    b.name
                ),
                None => {}
            }
            held.is_none()
        });
        let quiet = args.output.quiet || args.output.json;
        let mut batches = send_batches(edge, &ready, quiet);
        refused.extend(
            ready
                .iter()
                .filter(|b| !batches.iter().any(|r| r.batch == b.name))
                .filter(|b| edge.held_back(b) == Some(BatchState::Refused))
                .map(|b| b.name.clone()),
        );
        // Batches the relay held some of already, from a run this catalogue has no record
        // of, go once more: their files are in the catalogue now, so the relay is asked first.
        let again: Vec<Batch> = ready
            .into_iter()
            .filter(|b| batches.iter().any(|r| r.send_again && r.batch == b.name))
            .collect();
        if !again.is_empty() {
            batches.retain(|r| !r.send_again);
            edge.reopen();
            batches.extend(send_batches(edge, &again, quiet));
        }
        // Report in inbox order, whatever order the policy finished them in.
        batches.sort_by(|a, b| a.batch.cmp(&b.batch));
        if !args.output.json {
            batches.iter().for_each(print_report);
            let seconds = started.elapsed().as_secs_f64();
            let raw: u64 = batches.iter().map(|b| b.raw_bytes).sum();
            let sealed: u64 = batches.iter().map(|b| b.sealed_bytes).sum();
            println!(
                "sent {} batches: {} raw as {} sealed in {seconds:.1} s ({:.1} MB/s raw)",
                batches.len(),
                human(raw),
                human(sealed),
                mb_per_s(raw, seconds)
            );
            for name in &refused {
                println!(
                    "batch {name}: refused by a site task, not sent (forte status says why); touch its {READY_MARKER} marker to check and send it again"
                );
            }
            for name in &waiting {
                println!("batch {name}: not ready (changed in the last {} s and no {READY_MARKER} marker)", args.settle);
            }
        }
        let ok = batches.iter().all(|b| b.failed == 0) && refused.is_empty();
        if args.output.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&Summary {
                    command: "send",
                    batches,
                    waiting
                })?
            );
        }
        Ok(ok)
    }

    /// Scans the inbox every interval and sends what is ready, until stopped.
    fn watch(&self, args: &Args) -> Result<bool> {
        let (edge, settle) = (self.edge, self.settle);
        println!(
            "watching {} every {} s (Ctrl-C or SIGTERM stops after the batches under way; a restart resumes where this left off)",
            args.inbox.display(),
            args.daemon.interval
        );
        let interval = Duration::from_secs(args.daemon.interval);
        signals::install(
            "what was not uploaded is sent at the next start, which asks the relay what it holds",
        );
        signals::end_after_grace(args.daemon.shutdown_grace);
        std::thread::scope(|s| {
            let inbox = &args.inbox;
            s.spawn(move || {
                while !signals::stop_requested() {
                    if signals::take_reload() {
                        println!("SIGHUP: send reads its settings when it starts; restart it to change them");
                    }
                    edge.find_lost();
                    match ready_batches(inbox, settle) {
                        Ok(found) => {
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
                        Err(e) => edge.report_failure("", &format!("{e:#}")),
                    }
                    if args.delete_after_ack {
                        edge.delete_acknowledged(inbox);
                    }
                    edge.take_finished();
                    signals::sleep_unless_stopped(interval);
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
                    println!(
                        "stopped ({}): every batch admitted was sent and sealed; a restart resumes",
                        signals::which()
                    );
                    return Ok(true);
                }
                signals::sleep_unless_stopped(interval);
            }
        })
    }
}

fn print_report(report: &SendReport) {
    println!(
        "batch {}: sent {} of {} files ({} sent before, {} failed), {} raw as {} sealed",
        report.batch,
        report.sent,
        report.files,
        report.already_at_relay,
        report.failed,
        human(report.raw_bytes),
        human(report.sealed_bytes),
    );
    // Failures were logged as they happened (one JSON line each, `Failures::report`); only
    // the skipped files, which are not failures of the transfer, are listed here.
    for e in report.errors.iter().filter(|e| e.starts_with("skipped ")) {
        eprintln!("batch {}: {e}", report.batch);
    }
}
