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
//! The cap is max-min fair, found by water-filling on the rates measured over each
//! [`DECIDE_EVERY`]: a site limited by something of its own (its link, its CPU) keeps what it
//! uses, and the rest is split equally between the others, with [`HEADROOM`] so a capped site
//! can still show that it wants more; while the cap holds every one of them it grows by
//! [`GROW`] (the link may have room). Rates alone cannot tell a site limited on its own side
//! from one crowded out on a shared link (both send under the cap), so the relay asks the
//! link: a site that falls under [`SATISFIED`] of the cap is held for [`HOLD`] with the cap at
//! no more than an equal split of the highest total seen lately ([`PEAK_KEPT`]; the total
//! under a cap is held down by it); if the others' cap freed room on a shared link the site
//! rises to it, and only if it stays under is it taken to be limited on its own side and left
//! out of the split. Every [`RECHECK`] such verdicts are asked again from a fresh equal split,
//! so a site that was short of work for a while gets its share back. The cost on separate
//! links: the faster site is held to an equal share for [`HOLD`] and climbs back once every
//! [`RECHECK`] (its mean rate is 92 % of its link in the model test);
//! `forte relay --no-fair-shares` turns shares off.
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
const DECIDE_EVERY: Duration = Duration::from_secs(1);
/// A site counts as sending while its bytes arrived this recently.
const SENDING_WITHIN: Duration = Duration::from_secs(2);
/// A capped site may go this much over an equal split of what the sites under it use, so a
/// site that wants more goes on showing it, and what another leaves unused flows back.
const HEADROOM: f64 = 1.03;
/// A site sending less than this share of the cap may be limited by something of its own.
const SATISFIED: f64 = 0.8;
/// How long a site under [`SATISFIED`] of the cap is held at an equal share before it is
/// taken to be limited on its own side: long enough for TCP and its tuner to take room the
/// cap freed, and longer than one probe of its tuner (at most 10 s): at 5 s a sender's probe
/// of one upload fewer on a +200 ms link passed for its own limit, and the other site took
/// 0.58 of the link until the verdict was asked again.
const HOLD: Duration = Duration::from_secs(10);
/// How long that verdict lasts before the site is held at an equal share again.
const RECHECK: Duration = Duration::from_secs(60);
/// Sites sending at this share of the cap or more are held by it: when every site that wants
/// more is, two decisions running (one such second is noise on a long round trip: it made
/// the cap overshoot by a fifth), the cap may be what keeps the link from filling, and it
/// grows by [`GROW`] (a start from slow first rates reaches the link in seconds, not a minute
/// at [`HEADROOM`]).
const BOUND: f64 = 0.97;
const GROW: f64 = 1.15;
/// Per decision, how much of the highest total the sites were seen to get together is still
/// believed: an equal split is of that, not of a total a cap has just held down.
const PEAK_KEPT: f64 = 0.98;

/// The last decision of this process's relay, for its page: like its metrics, process-wide
/// (one relay per process outside tests).
static LAST_DECISION: Mutex<Option<Decision>> = Mutex::new(None);

/// A decision of the shares: each sending site's rate over the last interval, and the cap.
#[derive(Debug, Clone)]
pub struct Decision {
    /// When it was decided: decisions are made as bytes arrive, so once none do, the last one
    /// stands for a past that [`last_decision`] does not report.
    pub at: Instant,
    /// Bytes per second each site sending got between the last two decisions.
    pub rates: Vec<(String, f64)>,
    /// The rate each sending site is held to; `None` while fewer than two send.
    pub cap: Option<f64>,
}

/// The shares last decided, if lately: decisions come every [`DECIDE_EVERY`] while bytes
/// arrive, so one older than a few of those means no site sends now.
pub fn last_decision() -> Option<Decision> {
    LAST_DECISION
        .lock()
        .clone()
        .filter(|d| d.at.elapsed() < DECIDE_EVERY * 5)
}

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
    /// When the cap was last set to an equal split of the total, every site's verdict new.
    split_at: Option<Instant>,
    /// The highest total rate of all sites lately ([`PEAK_KEPT`]): what they can get together.
    peak_total: f64,
    /// Decisions running at which the cap held every site that wants more ([`BOUND`]).
    all_bound_for: u32,
}

struct Flow {
    /// Bytes arrived since the last decision.
    arrived: u64,
    /// Bytes per second between the last two decisions.
    rate: f64,
    last_arrival: Instant,
    /// Since when it has sent under [`SATISFIED`] of the cap, if it does.
    under_since: Option<Instant>,
    /// When every byte read so far is paid for at the cap (see [`reserve`]).
    paid_until: Instant,
}

impl Flow {
    fn standing(&self, now: Instant) -> Standing {
        match self.under_since {
            None => Standing::Wanting,
            Some(since) if now.duration_since(since) < HOLD => Standing::Held,
            Some(_) => Standing::OwnLimited,
        }
    }
}

/// Where a sending site stands against the cap.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Standing {
    /// At the cap or near it: it takes an equal share of what is left.
    Wanting,
    /// Under the cap, since less than [`HOLD`]: the cap is held where it is while the link
    /// shows whether the room it frees goes to this site.
    Held,
    /// Under the cap for [`HOLD`] or more: limited on its own side; it keeps what it uses.
    OwnLimited,
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
            under_since: None,
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
            flow.rate = flow.arrived as f64 / elapsed;
            flow.arrived = 0;
        }
        let cap = if fair { self.next_cap(now) } else { None };
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
        *LAST_DECISION.lock() = Some(Decision {
            at: now,
            rates: self
                .sites
                .iter()
                .map(|(s, f)| (s.clone(), f.rate))
                .collect(),
            cap,
        });
        self.cap = cap;
    }

    /// The cap from the rates just measured: `None` while fewer than two sites send.
    fn next_cap(&mut self, now: Instant) -> Option<f64> {
        let sending = self.sites.len();
        if sending < 2 {
            self.split_at = None;
            return None;
        }
        let total: f64 = self.sites.values().map(|f| f.rate).sum();
        self.peak_total = total.max(self.peak_total * PEAK_KEPT);
        let recheck_due = |at: Instant| {
            now.duration_since(at) >= RECHECK
                && self
                    .sites
                    .values()
                    .any(|f| f.standing(now) == Standing::OwnLimited)
        };
        let (Some(cap), Some(split_at)) = (self.cap, self.split_at) else {
            return self.equal_split(now);
        };
        if recheck_due(split_at) {
            return self.equal_split(now);
        }
        let mut newly_held = false;
        for flow in self.sites.values_mut() {
            if flow.rate >= SATISFIED * cap {
                flow.under_since = None;
            } else if flow.under_since.is_none() {
                flow.under_since = Some(now);
                newly_held = true;
            }
        }
        let standing: Vec<(f64, Standing)> = self
            .sites
            .values()
            .map(|f| (f.rate, f.standing(now)))
            .collect();
        let of = |which: Standing| standing.iter().filter(move |(_, s)| *s == which);
        let own: f64 = of(Standing::OwnLimited).map(|(rate, _)| rate).sum();
        let others = sending - of(Standing::OwnLimited).count();
        let split = |total: f64| HEADROOM * (total - own) / others.max(1) as f64;
        let all_bound = others > 0
            && of(Standing::Wanting).all(|(rate, _)| *rate >= BOUND * cap)
            && of(Standing::Held).next().is_none();
        self.all_bound_for = if all_bound { self.all_bound_for + 1 } else { 0 };
        let next = if newly_held {
            // Held at no more than an equal share of what the others leave of the peak: if
            // they share a link with it, the room this frees goes to it.
            cap.min(split(self.peak_total))
        } else if of(Standing::Held).next().is_some() {
            cap
        } else if others == 0 {
            // Every site is limited on its own side: the cap binds nobody.
            cap * HEADROOM
        } else if self.all_bound_for >= 2 {
            cap * GROW
        } else {
            split(total)
        };
        Some(within(next, total))
    }

    /// A fresh equal split of the peak total between every sending site, each one's verdict
    /// new.
    fn equal_split(&mut self, now: Instant) -> Option<f64> {
        for flow in self.sites.values_mut() {
            flow.under_since = None;
        }
        self.split_at = Some(now);
        let total = self.peak_total;
        Some(within(HEADROOM * total / self.sites.len() as f64, total))
    }
}

/// `cap`, never above `total`: a cap higher than what all sites get together binds nobody.
fn within(cap: f64, total: f64) -> f64 {
    cap.clamp(1.0, total.max(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: f64 = 1e6;
    const LINK: f64 = 65.0 * MB;
    const STEP: Duration = DECIDE_EVERY;

    /// A link of [`LINK`] shared per connection: sites with `connections` each, each sending
    /// at most its `limit` and the relay's cap; what one cannot use goes to the others.
    fn link(connections: &[f64], limit: &[f64], cap: Option<f64>) -> Vec<f64> {
        let ceiling: Vec<f64> = limit.iter().map(|l| cap.map_or(*l, |c| l.min(c))).collect();
        let mut rate = vec![0.0; connections.len()];
        let mut open: Vec<usize> = (0..connections.len()).collect();
        let mut left = LINK;
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

    /// Two sites "a" and "b" through a real [`Shares`] on simulated time, half a second a
    /// step: `limits(step)` gives each one's own limit. Returns the rates of every step.
    fn run(
        connections: [f64; 2],
        steps: usize,
        limits: impl Fn(usize) -> [f64; 2],
    ) -> Vec<[f64; 2]> {
        let shares = Shares::new(true);
        let start = Instant::now();
        let mut out = Vec::new();
        for step in 0..steps {
            let now = start + STEP * step as u32;
            // The decision first, on the last step's bytes, as a relay decides on the bytes
            // that arrived under the cap in force since the decision before.
            shares.arrived("a", 0, now);
            let cap = shares.cap_for("a");
            let rates = link(&connections, &limits(step), cap);
            for (site, rate) in ["a", "b"].into_iter().zip(&rates) {
                shares.arrived(site, (rate * STEP.as_secs_f64()) as usize, now);
            }
            out.push([rates[0], rates[1]]);
        }
        out
    }

    /// a's share over the 5 s from `step` (the bench looks at 10-s windows).
    fn share(rates: &[[f64; 2]], step: usize) -> f64 {
        let window = &rates[step..(step + 5).min(rates.len())];
        let a: f64 = window.iter().map(|r| r[0]).sum();
        a / window.iter().map(|r| r[0] + r[1]).sum::<f64>()
    }

    #[test]
    fn two_sites_on_one_link_get_equal_shares_whatever_their_connections() {
        // 11 uploads against 3: TCP alone gives the first 0.79 of the link.
        let rates = run([11.0, 3.0], 120, |_| [f64::MAX; 2]);
        for (step, r) in rates.iter().enumerate().skip(10) {
            assert!(
                (0.45..=0.55).contains(&share(&rates, step)),
                "step {step}: {r:?}"
            );
            assert!((r[0] + r[1]) / LINK > 0.99, "the link stays full: {r:?}");
        }
    }

    #[test]
    fn a_site_held_back_by_its_own_link_does_not_hold_the_other_back() {
        // b can send only 10 MB/s (its own link, its CPU): a gets the rest, but for the
        // rechecks of b's verdict.
        let rates = run([3.0, 11.0], 240, |_| [f64::MAX, 10.0 * MB]);
        let a: f64 = rates.iter().skip(10).map(|r| r[0]).sum::<f64>() / 230.0;
        assert!(a / MB > 0.9 * 55.0, "a averaged {:.1} MB/s", a / MB);
        assert!(rates.iter().all(|r| (r[1] / MB - 10.0).abs() < 0.1));
    }

    #[test]
    fn a_site_short_of_work_for_a_while_gets_its_share_back() {
        // b has 3 connections against a's 11 and is short of work (2 MB/s) for 3 s, then for
        // 15 s: the short dip is not a verdict; after the long one b is held at an equal share
        // again within a recheck and takes it.
        let (short, long) = (20..23, 50..65);
        let rates = run([11.0, 3.0], 200, |step| {
            let idle = short.contains(&step) || long.contains(&step);
            [f64::MAX, if idle { 2.0 * MB } else { f64::MAX }]
        });
        for step in 25..45 {
            assert!(
                (0.45..=0.55).contains(&share(&rates, step)),
                "step {step}: {:?}",
                rates[step]
            );
        }
        let back = (65..200)
            .find(|&s| (0.45..=0.55).contains(&share(&rates, s)))
            .expect("b gets its share back");
        let seconds = (back - 65) as f64 * STEP.as_secs_f64();
        assert!(
            seconds <= (HOLD + RECHECK).as_secs_f64(),
            "back after {seconds} s"
        );
        for step in back..195 {
            assert!(
                (0.45..=0.55).contains(&share(&rates, step)),
                "step {step}: {:?}",
                rates[step]
            );
        }
    }

    #[test]
    fn one_site_sending_is_never_capped() {
        let shares = Shares::new(true);
        let start = Instant::now();
        for step in 0..10u32 {
            assert_eq!(
                shares.arrived("a", 60 << 20, start + STEP * step),
                Duration::ZERO
            );
        }
        assert_eq!(shares.cap_for("a"), None);
    }

    #[test]
    fn the_relay_makes_a_capped_site_wait_and_forgets_sites_that_stopped() {
        let shares = Shares::new(true);
        let start = Instant::now();
        let chunk = 64 << 10;
        // Two sites at 40 and 20 MB/s for two seconds, in 10 ms steps.
        let mut waited = Duration::ZERO;
        for step in 0..200u32 {
            let now = start + Duration::from_millis(10) * step;
            for _ in 0..6 {
                waited += shares.arrived("a", chunk, now);
            }
            for _ in 0..3 {
                shares.arrived("b", chunk, now);
            }
        }
        assert!(shares.cap_for("a").is_some(), "two sites sending share");
        assert!(waited > Duration::ZERO, "the faster site was made to wait");
        // b stops; once it has been silent for SENDING_WITHIN the cap is lifted.
        let later = start + Duration::from_secs(5);
        assert_eq!(shares.arrived("a", chunk, later), Duration::ZERO);
        assert_eq!(shares.cap_for("a"), None);
        // Without fair shares nothing is capped.
        let tcp = Shares::new(false);
        for step in 0..200u32 {
            let now = start + Duration::from_millis(10) * step;
            assert_eq!(tcp.arrived("a", chunk * 6, now), Duration::ZERO);
            tcp.arrived("b", chunk, now);
        }
        assert_eq!(tcp.cap_for("a"), None);
    }
}
