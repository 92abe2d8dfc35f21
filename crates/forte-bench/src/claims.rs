//! `forte-bench claims`: how many batches a catalogue hands out per second to core workers
//! competing for them, the figure that bounds how many small batches a fleet of `pull` workers
//! on one PostgreSQL can deliver (docs/scale.md).
//!
//! Each worker is a thread with its own catalogue connection pool, as a worker on its own
//! machine has, and goes through the same list of batches in the same order (the order the
//! relay lists them), claiming each with the lease of a real pull; a batch another worker won is
//! skipped. A granted claim is then renewed once and left to run out, as a delivered batch is.
//! So every attempt is one claim statement, every grant also one renewal, and each batch must be
//! granted exactly once, which the run checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use forte_catalog::{BatchKey, Catalog, Claim};

#[derive(clap::Args)]
pub struct ClaimsBench {
    /// The catalogue to measure: postgres://user:pass@host/db (a scratch database: the run adds
    /// batch claims to it), or a SQLite file.
    #[arg(value_name = "CATALOG")]
    catalog: String,
    /// Workers claiming at once, each with its own connections.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Batches to hand out.
    #[arg(long, default_value_t = 2000)]
    batches: usize,
}

pub fn run(b: ClaimsBench) -> Result<bool> {
    if b.workers == 0 || b.batches == 0 {
        bail!("--workers and --batches must be at least 1");
    }
    // Opened first, it migrates the catalogue, so the workers' clocks start on a ready schema.
    let catalog = Catalog::open(&b.catalog)?;
    let run = format!("bench-{}", std::process::id());
    let batches: Vec<BatchKey> = (0..b.batches)
        .map(|i| BatchKey::core(&run, format!("b{i:06}")))
        .collect();
    let (attempts, grants) = (AtomicU64::new(0), AtomicU64::new(0));
    let lease = Duration::from_secs(30);
    let started = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..b.workers)
            .map(|w| {
                let (batches, attempts, grants) = (&batches, &attempts, &grants);
                let catalog = &b.catalog;
                s.spawn(move || -> Result<()> {
                    let leases = Catalog::open(catalog)?.leases();
                    let name = format!("bench-worker-{w}");
                    for batch in batches {
                        attempts.fetch_add(1, Ordering::Relaxed);
                        if let Claim::Held(held) = leases.claim(batch, &name, lease, None)? {
                            grants.fetch_add(1, Ordering::Relaxed);
                            leases.renew(&held, lease)?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a bench worker panicked")?;
        }
        Ok(())
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let (attempts, grants) = (attempts.into_inner(), grants.into_inner());
    println!(
        "{} workers, {} batches on {}: {grants} granted ({:.0}/s), {attempts} claims tried ({:.0}/s), {seconds:.2} s",
        b.workers,
        b.batches,
        catalog.url(),
        grants as f64 / seconds,
        attempts as f64 / seconds,
    );
    if grants != b.batches as u64 {
        bail!(
            "{grants} batches granted of {}: a batch was claimed twice or not at all",
            b.batches
        );
    }
    Ok(true)
}
