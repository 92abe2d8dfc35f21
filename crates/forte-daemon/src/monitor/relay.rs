//! What the relay shows on `--http` beside its metrics (it keeps no catalogue): what its store
//! holds per site and batch, read as `forte relay-store list` reads it, each site against its
//! quota, and the fair shares in force; its gauges are set as the store is read.

use anyhow::Result;
use forte_relay::server::store::{Location, Store};
use forte_relay::server::SiteHeld;

/// The relay's live view for `forte_view`: its store at `store`, with `quota_per_site`, fair
/// shares on or off (`fair`).
pub fn relay_view(
    store: Location,
    quota_per_site: Option<u64>,
    fair: bool,
) -> Box<dyn forte_view::Live> {
    Box::new(RelayView {
        store,
        quota_per_site,
        fair,
        sites_seen: Default::default(),
    })
}

/// What the relay shows on `--http` (it keeps no catalogue): what its store holds, read as
/// `forte relay-store list` reads it, its fair shares, and its metrics.
struct RelayView {
    store: Location,
    quota_per_site: Option<u64>,
    fair: bool,
    /// Sites seen holding something, whose gauges go to 0 once they hold nothing.
    sites_seen: std::sync::Mutex<Vec<String>>,
}

impl RelayView {
    fn read(&self) -> Result<forte_view::RelayHoldings> {
        let holdings = Store::inspect(self.store.clone())?
            .holdings()
            .map_err(|e| anyhow::anyhow!("cannot list the store: {e:?}"))?;
        let (cap, rates) = forte_relay::server::share::last_decision()
            .map(|d| (d.cap, d.rates))
            .unwrap_or_default();
        let acknowledged = counter_value(
            &forte_relay::server::metrics_text(),
            "forte_relay_objects_acknowledged_total",
        );
        let view = forte_view::RelayHoldings::of(
            holdings.into_iter().map(|h| {
                forte_view::HeldBatch::new(
                    h.site,
                    h.batch,
                    h.batch_sealed,
                    (h.objects, h.bytes),
                    (h.oldest, h.newest),
                )
            }),
            self.quota_per_site,
            forte_view::ShareView::new(self.fair, cap, &rates),
            &rates,
            acknowledged as u64,
        );
        let mut seen = self.sites_seen.lock().unwrap_or_else(|e| e.into_inner());
        for s in &view.sites {
            if !seen.contains(&s.site) {
                seen.push(s.site.clone());
            }
        }
        let held: Vec<SiteHeld> = view
            .sites
            .iter()
            .map(|s| SiteHeld {
                site: &s.site,
                bytes: s.bytes,
                objects: s.objects,
                sealed_batches: view.sealed_batches(&s.site),
                oldest_age_s: view.oldest_age_s(&s.site),
            })
            .collect();
        forte_relay::server::set_held_gauges(&held, self.quota_per_site, &seen);
        Ok(view)
    }
}

/// The value of an unlabelled counter in Prometheus' text, 0 if absent.
fn counter_value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

impl forte_view::Live for RelayView {
    fn stages(&self) -> Vec<forte_view::StageView> {
        vec![]
    }

    fn queue(&self) -> Option<forte_view::QueueView> {
        None
    }

    fn metrics(&self) -> Option<String> {
        // The gauges of what the store holds are set as it is read.
        if let Err(e) = self.read() {
            tracing::warn!("the store's gauges are not up to date: {e:#}");
        }
        Some(forte_relay::server::metrics_text())
    }

    fn relay(&self) -> Option<forte_view::RelayHoldings> {
        match self.read() {
            Ok(view) => Some(view),
            Err(e) => {
                tracing::warn!("cannot show what the relay holds: {e:#}");
                None
            }
        }
    }
}
