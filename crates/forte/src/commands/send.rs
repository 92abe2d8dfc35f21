//! `forte send`: the ready batches of an inbox, prepared and uploaded to the relay in one
//! streaming pass, in the order of the queue policy, each sealed at the relay as soon as its
//! last file is. The work is `forte_edge::send`; this parses, calls it and prints.

use std::path::PathBuf;

use anyhow::Result;
use forte_daemon::record::{self, Use};
use forte_daemon::settings::{
    Config, DaemonFlags, EdgeFlags, RelayFlags, ScheduleFlags, SendCommand, SendFlags,
};
use forte_edge::send::{send, PassReport, SendOutput, Sent};
use forte_edge::SendReport;
use serde::Serialize;

use super::{print_as, Output};

#[derive(clap::Args)]
pub struct Args {
    /// Inbox directory: each subdirectory is one batch [config: send.inbox].
    inbox: PathBuf,
    #[command(flatten)]
    relay: RelayFlags,
    #[command(flatten)]
    edge: EdgeFlags,
    #[command(flatten)]
    send: SendFlags,
    #[command(flatten)]
    schedule: ScheduleFlags,
    #[command(flatten)]
    daemon: DaemonFlags,
    /// Print what a send would do and change nothing: per ready batch its files after the
    /// filters (what they leave out and why), each marked sent or acknowledged before as the
    /// catalogue, opened read-only, says; with --delete-after-ack, the sources the core's
    /// receipts (asked of the relay, read-only) would have deleted. No upload, no catalogue
    /// write, no deletion [per run].
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    output: Output,
}

#[derive(Serialize)]
struct Summary<'a> {
    command: &'static str,
    batches: &'a [SendReport],
    waiting: &'a [String],
    cancelled: &'a [String],
}

/// `catalog`: the --catalog flag (or the config's); send opens it to write, a dry run to read.
pub fn run(args: Args, config: &Config, catalog: Option<String>) -> Result<bool> {
    let flags = SendCommand {
        inbox: &args.inbox,
        send: &args.send,
        relay: &args.relay,
        edge: &args.edge,
        schedule: &args.schedule,
        daemon: &args.daemon,
    };
    if args.dry_run {
        let catalog = record::open_read_only(catalog, Use::Edge)?;
        let plan = forte_edge::dry_run::send(flags, config, catalog.as_ref())?;
        print_as(args.output.json, &plan, || plan.text())?;
        return Ok(true);
    }
    if args.daemon.watch {
        // Before the catalogue opens: a stop asked for while it starts is heeded.
        forte_daemon::signals::install(forte_edge::send::LEFT_AT_STOP);
    }
    let catalog = &record::open(catalog, Use::Edge)?;
    let output = SendOutput {
        quiet: args.output.quiet || args.output.json,
        // Watching, each batch is printed as it finishes: with --json, one JSON line each.
        on_finished: if args.output.json {
            print_report_json
        } else {
            print_report
        },
    };
    match send(flags, config, catalog, output)? {
        Sent::Pass(pass) => print_pass(&pass, args.output.json),
        Sent::Stopped => Ok(true),
        Sent::Cancelled(done) => {
            print_as(args.output.json, &done, || {
                done.iter().map(|c| c.text()).collect()
            })?;
            Ok(done.iter().all(|c| c.error.is_none()))
        }
    }
}

/// Prints one pass, as text or JSON; true when every file of every batch went.
fn print_pass(pass: &PassReport, json: bool) -> Result<bool> {
    if json {
        let summary = Summary {
            command: "send",
            batches: &pass.batches,
            waiting: &pass.waiting,
            cancelled: &pass.cancelled,
        };
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        pass.batches.iter().for_each(warn_skipped);
        println!("{}", pass.text());
    }
    Ok(pass.ok())
}

fn print_report_json(report: &SendReport) {
    println!("{}", serde_json::json!(report));
}

fn print_report(report: &SendReport) {
    println!("{}", report.text());
    warn_skipped(report);
}

/// Failures were logged as they happened (`forte_daemon::failures`); only the skipped files,
/// which are not failures of the transfer, are told here.
fn warn_skipped(report: &SendReport) {
    for e in report.errors.iter().filter(|e| e.starts_with("skipped ")) {
        tracing::warn!("batch {}: {e}", report.batch);
    }
}
