//! Fair shares of the relay's ingress between sites.
//!
//! Two sites sending at once over one link split it the way TCP splits it: per connection.
//! Each site's tuner picks its own number of uploads, so the site that climbed higher kept
//! two thirds of the link and more (measured: shares of 0.23 to 0.74 per 10 s). The relay is
//! the one place that sees every site, so it hands out the shares: it measures each site's
//! rate as body bytes arrive and, while two or more sites are sending, holds each to a cap
//! by reading its bodies no faster than that (TCP's flow control carries the pace back to
//! the sender, so nothing times out and no sender has to cooperate).
//!
//! The cap is max-min fair, found by water-filling on measured rates every [`DECIDE_EVERY`]:
//! a site sending well under the cap ([`SATISFIED`]) is limited by something of its own (its
//! link, its CPU) and keeps what it uses; the rest of the measured total is split equally
//! between the others, with [`HEADROOM`] so a capped site can still show that it wants more.
//! A site whose own link is the slower one is therefore never held back by the cap of
//! another, and the cap grows away from a site it does not bind. The one case rates cannot
//! tell apart: two sites on separate links whose rates are within a fifth of each other are
//! treated as sharing one, and the faster is held to within [`HEADROOM`] of the slower.
//!
//! Shares are per relay process: relays behind a load balancer each share what they see.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use http_body::{Frame, SizeHint};
use parking_lot::Mutex;

use crate::pace::reserve;

/// How often the cap is decided again from the rates measured since the last decision.
const DECIDE_EVERY: Duration = Duration::from_millis(500);
/// A site counts as sending while its bytes arrived this recently.
const SENDING_WITHIN: Duration = Duration::from_secs(2);
/// A capped site may go this much over an equal split of what the sites under it use, so a
/// site that wants more goes on showing it, and what another leaves unused flows back.
const HEADROOM: f64 = 1.05;
/// A site sending less than this share of the cap is limited by something of its own.
const SATISFIED: f64 = 0.8;
/// Weight of the newest interval in a site's smoothed rate.
const SMOOTHING: f64 = 0.5;

/// The sites' flows and the cap in force.
pub struct Shares {
    /// Caps are decided; without, flows are only counted.
    fair: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    sites: HashMap<String, Flow>,
    /// Bytes per second each sending site is held to; `None` while fewer than two send.
    cap: Option<f64>,
    decided: Option<Instant>,
}

struct Flow {
    /// Bytes arrived since the last decision.
    arrived: u64,
    /// Smoothed bytes per second over the last decisions.
    rate: f64,
    last_arrival: Instant,
    /// When every byte read so far is paid for at the cap (see [`reserve`]).
    paid_until: Instant,
}

impl Shares {
    pub fn new(fair: bool) -> Self {
        Self {
            fair,
            state: Mutex::default(),
        }
    }

    /// Counts `bytes` of `site`'s upload as arrived at `now`; returns how long to wait before
    /// reading more of it.
    pub fn arrived(&self, site: &str, bytes: usize, now: Instant) -> Duration {
        ::metrics::counter!("forte_relay_received_bytes_total", "site" => site.to_owned())
            .increment(bytes as u64);
        let mut state = self.state.lock();
        if state
            .decided
            .is_none_or(|at| now.duration_since(at) >= DECIDE_EVERY)
        {
            state.decide(now, self.fair);
        }
        let cap = state.cap;
        let flow = state.sites.entry(site.to_owned()).or_insert_with(|| Flow {
            arrived: 0,
            rate: 0.0,
            last_arrival: now,
            paid_until: now,
        });
        flow.arrived += bytes as u64;
        flow.last_arrival = now;
        match cap {
            Some(cap) => reserve(&mut flow.paid_until, now, bytes as u64, cap),
            None => {
                flow.paid_until = now;
                Duration::ZERO
            }
        }
    }

    /// The rate `site` is held to now, if any: told to the sender so its tuner knows a limit
    /// binds.
    pub fn cap_for(&self, site: &str) -> Option<f64> {
        let state = self.state.lock();
        state.cap.filter(|_| state.sites.contains_key(site))
    }
}

/// An upload's body read at its site's share: each chunk that arrives is counted, and the
/// next is not asked for until the site's cap allows.
pub struct SharedBody {
    inner: Body,
    site: String,
    shares: Arc<Shares>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl SharedBody {
    pub fn new(inner: Body, site: String, shares: Arc<Shares>) -> Self {
        Self {
            inner,
            site,
            shares,
            wait: None,
        }
    }
}

impl http_body::Body for SharedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Some(wait) = &mut this.wait {
            ready!(wait.as_mut().poll(cx));
            this.wait = None;
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
            let wait = this.shares.arrived(&this.site, data.len(), Instant::now());
            if !wait.is_zero() {
                this.wait = Some(Box::pin(tokio::time::sleep(wait)));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl State {
    fn decide(&mut self, now: Instant, fair: bool) {
        let elapsed = self
            .decided
            .map_or(DECIDE_EVERY, |at| now.duration_since(at))
            .as_secs_f64()
            .max(1e-3);
        self.decided = Some(now);
        self.sites
            .retain(|_, f| now.duration_since(f.last_arrival) < SENDING_WITHIN);
        for flow in self.sites.values_mut() {
            let rate = flow.arrived as f64 / elapsed;
            flow.rate = SMOOTHING * rate + (1.0 - SMOOTHING) * flow.rate;
            flow.arrived = 0;
        }
        let cap = water_fill(self.sites.values().map(|f| f.rate), self.cap).filter(|_| fair);
        tracing::debug!(
            rates = ?self.sites.iter().map(|(s, f)| format!("{s} {:.1}", f.rate / 1e6)).collect::<Vec<_>>(),
            cap = ?cap.map(|c| (c / 1e6 * 10.0).round() / 10.0),
            "ingress share decided (MB/s)"
        );
        if cap.is_some() != self.cap.is_some() {
            match cap {
                Some(cap) => tracing::info!(
                    sites = self.sites.len(),
                    cap = %format!("{:.1} MB/s", cap / 1e6),
                    "sites share the relay's ingress"
                ),
                None => tracing::info!("one site sending: no share in force"),
            }
        }
        ::metrics::gauge!("forte_relay_site_share_bytes_per_second").set(cap.unwrap_or(0.0));
        ::metrics::gauge!("forte_relay_sites_sending").set(self.sites.len() as f64);
        self.cap = cap;
    }
}

/// The next cap from the sites' measured rates and the cap in force: `None` while fewer
/// than two send. With no cap yet every site counts as wanting more (an equal split); with
/// one, the sites under [`SATISFIED`] of it keep what they use and the rest is split.
fn water_fill(rates: impl Iterator<Item = f64> + Clone, cap: Option<f64>) -> Option<f64> {
    let sending = rates.clone().count();
    if sending < 2 {
        return None;
    }
    let total: f64 = rates.clone().sum();
    let wanting = |r: &f64| cap.is_none_or(|c| *r >= SATISFIED * c);
    let (wanting_count, wanting_sum) = rates
        .filter(wanting)
        .fold((0usize, 0.0), |(n, s), r| (n + 1, s + r));
    let next = match wanting_count {
        // Nobody is near the cap: it binds nobody, so it grows out of the way.
        0 => cap.unwrap_or(total) * HEADROOM,
        n => HEADROOM * wanting_sum / n as f64,
    };
    // Never above the whole measured total: a cap that high binds nobody either, and from
    // there it comes back within a decision once the sites do share.
    Some(next.clamp(1.0, total.max(1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: f64 = 1e6;

    /// The link of `capacity` MB/s shared per connection: sites with `connections` each,
    /// each asking for at most its cap, and for at most its own `limit`; what a capped site
    /// leaves goes to the others. Returns each site's rate.
    fn link(capacity: f64, connections: &[f64], limit: &[f64], cap: Option<f64>) -> Vec<f64> {
        let ceiling: Vec<f64> = limit.iter().map(|l| cap.map_or(*l, |c| l.min(c))).collect();
        let mut rate = vec![0.0; connections.len()];
        let mut open: Vec<usize> = (0..connections.len()).collect();
        let mut left = capacity;
        // Water-filling of the link by connections, each site up to its ceiling.
        while !open.is_empty() && left > 1e-9 {
            let weight: f64 = open.iter().map(|&i| connections[i]).sum();
            let full = open
                .iter()
                .copied()
                .find(|&i| rate[i] + left * connections[i] / weight >= ceiling[i]);
            match full {
                Some(i) => {
                    left -= ceiling[i] - rate[i];
                    rate[i] = ceiling[i];
                    open.retain(|&j| j != i);
                }
                None => {
                    for &i in &open {
                        rate[i] += left * connections[i] / weight;
                    }
                    left = 0.0;
                }
            }
        }
        rate
    }

    /// Runs `rounds` decisions on the model; returns the last rates and cap.
    fn converge(connections: &[f64], limit: &[f64], rounds: usize) -> (Vec<f64>, Option<f64>) {
        let mut cap = None;
        let mut rates = link(65.0 * MB, connections, limit, cap);
        for _ in 0..rounds {
            cap = water_fill(rates.iter().copied(), cap);
            rates = link(65.0 * MB, connections, limit, cap);
        }
        (rates, cap)
    }

    #[test]
    fn two_sites_on_one_link_get_equal_shares_whatever_their_connections() {
        // 11 uploads against 3 took 0.79 of the link per connection.
        let (rates, cap) = converge(&[11.0, 3.0], &[f64::MAX, f64::MAX], 10);
        let share = rates[0] / (rates[0] + rates[1]);
        assert!((0.45..=0.55).contains(&share), "share {share:.2}");
        assert!(
            ((rates[0] + rates[1]) / MB - 65.0).abs() < 0.1,
            "the link stays full"
        );
        assert!(cap.is_some());
    }

    #[test]
    fn a_site_held_back_by_its_own_link_does_not_hold_the_other_back() {
        // Site 2 can send only 10 MB/s (its own link or CPU): site 1 gets the other 55.
        let (rates, _) = converge(&[3.0, 11.0], &[f64::MAX, 10.0 * MB], 30);
        assert!((rates[1] / MB - 10.0).abs() < 0.1, "{rates:?}");
        assert!(
            rates[0] / MB > 54.0,
            "the faster site is not held back: {rates:?}"
        );
    }

    #[test]
    fn one_site_sending_is_never_capped() {
        assert_eq!(water_fill([60.0 * MB].into_iter(), Some(30.0 * MB)), None);
        assert_eq!(water_fill([].into_iter(), None), None);
    }

    #[test]
    fn the_relay_reads_a_capped_site_at_its_share_and_forgets_sites_that_stopped() {
        let shares = Shares::new(true);
        let start = Instant::now();
        let chunk = 64 << 10;
        // Two sites at 40 and 20 MB/s for two seconds, in 10 ms steps.
        let mut waited = Duration::ZERO;
        for step in 0..200u32 {
            let now = start + Duration::from_millis(10 * u64::from(step));
            for _ in 0..6 {
                waited += shares.arrived("a", chunk, now);
            }
            for _ in 0..3 {
                shares.arrived("b", chunk, now);
            }
        }
        let cap = shares.cap_for("a").expect("two sites sending share");
        // 60 MB/s measured, so each is held to 1.05 * 30 (b, sending under 0.8 of it, is
        // left its 20 and a gets the rest as it shows it wants more).
        assert!(cap / MB > 30.0 && cap / MB < 45.0, "cap {:.1}", cap / MB);
        assert!(waited > Duration::ZERO, "the faster site was made to wait");
        // b stops; once it has been silent for SENDING_WITHIN the cap is lifted.
        let later = start + Duration::from_secs(5);
        assert_eq!(shares.arrived("a", chunk, later), Duration::ZERO);
        assert_eq!(shares.cap_for("a"), None);
    }
}
