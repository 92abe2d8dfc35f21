//! The relay in the foreground ([`run`]): SIGHUP reads the tokens file again; SIGTERM or
//! SIGINT stops taking connections and lets the requests in flight finish within the grace
//! time; a second signal meanwhile ends the relay at once.

use anyhow::Result;
use tokio::runtime::Runtime;

use super::{start, RelayConfig, RunningRelay};

/// Serves in the foreground until interrupted; prints where and how to pin the certificate.
pub fn run(config: RelayConfig) -> Result<()> {
    let config_grace = config.shutdown_grace;
    let relay = start(config)?;
    announce(&relay);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let grace = config_grace;
    let stop = wait_for_stop(&runtime, &relay)?;
    tracing::info!(
        "relay shutting down ({stop}): no new connections; requests in flight have {} s to finish (a second signal ends it at once)",
        grace.as_secs_f64()
    );
    // A second signal while the requests finish ends the relay at once.
    end_at_a_second_signal();
    relay.shut_down(grace);
    tracing::info!("relay stopped");
    Ok(())
}

/// Prints where the relay listens and how senders and pullers pin its certificate.
fn announce(relay: &RunningRelay) {
    println!("relay listening on {}", relay.url());
    println!(
        "certificate {} (sha256 fingerprint {})",
        relay.cert_path.display(),
        relay.fingerprint
    );
    println!(
        "senders and pullers: --relay {} --relay-fingerprint {}",
        relay.url(),
        relay.fingerprint
    );
}

/// Waits on `runtime` for SIGTERM or SIGINT, reading the tokens file again at every SIGHUP
/// meanwhile; which of the two it was.
fn wait_for_stop(runtime: &Runtime, relay: &RunningRelay) -> Result<&'static str> {
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut hangup = signal(SignalKind::hangup())?;
        loop {
            tokio::select! {
                _ = term.recv() => return anyhow::Ok("SIGTERM"),
                _ = interrupt.recv() => return anyhow::Ok("SIGINT"),
                _ = hangup.recv() => match relay.reload_tokens() {
                    Ok(n) => tracing::info!(tokens = n, "tokens file reloaded (SIGHUP): {n} tokens in force"),
                    Err(e) => tracing::error!("tokens file not reloaded (SIGHUP), the tokens in force stay: {e:#}"),
                },
            }
        }
    })
}

/// From now on, in a thread of its own: a SIGTERM or SIGINT ends the process at once.
fn end_at_a_second_signal() {
    std::thread::spawn(move || {
        let again = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(again) = again {
            let _ = again.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                let mut term = signal(SignalKind::terminate())?;
                let mut interrupt = signal(SignalKind::interrupt())?;
                tokio::select! { _ = term.recv() => {}, _ = interrupt.recv() => {} }
                tracing::warn!("second signal: the relay ends at once; uploads cut off are sent again by their edges, and their partial files are removed at the next start");
                // Not a clean stop: what was in flight was cut off.
                std::process::exit(1);
                #[allow(unreachable_code)]
                anyhow::Ok(())
            });
        }
    });
}
