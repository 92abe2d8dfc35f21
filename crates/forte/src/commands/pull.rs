//! `forte pull`: whole batches from the relay, verified and delivered all or nothing, then
//! acknowledged so the relay may delete them. The work is `forte_core::pull`; this parses,
//! calls it and prints.

use anyhow::Result;
use forte_core::pull::{pull, PullPass, Pulled};
use forte_core::DeliveryReport;
use forte_daemon::record::Catalog;
use forte_daemon::settings::{
    self, Config, CoreFlags, DaemonFlags, PullCommand, PullFlags, RelayFlags, ScheduleFlags,
    WorkerFlags,
};
use forte_daemon::units::{human, mb_per_s};

use super::Output;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pull: PullFlags,
    #[command(flatten)]
    relay: RelayFlags,
    #[command(flatten)]
    core: CoreFlags,
    #[command(flatten)]
    schedule: ScheduleFlags,
    #[command(flatten)]
    worker: WorkerFlags,
    #[command(flatten)]
    daemon: DaemonFlags,
    /// Print what would be delivered (per sealed batch at the relay, its files and their
    /// destination paths, from its verified inventory) and change nothing: read-only requests
    /// to the relay, no claim, no download, no acknowledgement, no catalogue [per run].
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    output: Output,
}

pub fn run(args: Args, config: &Config, catalog: impl FnOnce() -> Result<Catalog>) -> Result<bool> {
    let flags = PullCommand {
        pull: &args.pull,
        relay: &args.relay,
        core: &args.core,
        schedule: &args.schedule,
        worker: &args.worker,
        daemon: &args.daemon,
    };
    let settings = settings::pull(flags, config)?;
    for warning in settings.warnings() {
        tracing::warn!("{warning}");
    }
    if args.dry_run {
        let planned = forte_core::dry_run::plan(&settings)?;
        match args.output.json {
            true => println!("{}", serde_json::to_string_pretty(&planned)?),
            false => print!("{}", forte_core::dry_run::text(&planned)),
        }
        return Ok(planned.iter().all(|d| d.error.is_none()));
    }
    if settings.daemon.watch {
        // Before the catalogue opens: a stop asked for while it starts is heeded.
        forte_daemon::signals::install(forte_core::pull::LEFT_AT_STOP);
    }
    let catalog = &catalog()?;
    // Each batch is printed as it is delivered; with --json only when watching (one JSON
    // line each), since a single pass prints them all as one document at its end.
    let on_report: Option<fn(&DeliveryReport)> = match (args.output.json, args.daemon.watch) {
        (false, _) => Some(print_report),
        (true, true) => Some(|r| println!("{}", serde_json::to_string(r).expect("serialises"))),
        (true, false) => None,
    };
    match pull(settings, catalog, on_report)? {
        Pulled::Pass(pass) => print_pass(&pass, args.output.json),
        Pulled::Stopped => Ok(true),
    }
}

/// Prints the end of one pass (each batch was printed as it was delivered); true when every
/// batch this worker took was delivered.
fn print_pass(pass: &PullPass, json: bool) -> Result<bool> {
    if json {
        println!("{}", serde_json::to_string_pretty(&pass.reports)?);
    } else if pass.listed == 0 {
        println!("nothing waiting at the relay");
    }
    let others = pass.left_to_others();
    if others > 0 {
        tracing::info!("{others} batches are being delivered by other workers; left to them");
    }
    Ok(pass.ok())
}

fn print_report(r: &DeliveryReport) {
    match &r.error {
        None => println!(
            "batch {} of {}: delivered {} files ({}) in {:.1} s ({:.1} MB/s){}, verified and acknowledged",
            r.batch,
            r.site,
            r.delivered_files,
            human(r.bytes),
            r.seconds,
            mb_per_s(r.bytes, r.seconds),
            if r.already_delivered > 0 { format!(", {} already in place", r.already_delivered) } else { String::new() }
        ),
        // The failure itself is logged once, by `Failures::report`.
        Some(_) => {
            for p in &r.rejected_parts {
                tracing::warn!("  reported damaged to the relay, which dropped it for the sender to upload again: {p}");
            }
        }
    }
}
