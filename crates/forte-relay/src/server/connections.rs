//! How many connections the relay holds, and for how long: a client that opens connections
//! and sends nothing (no token is needed to open one) must not use up the relay's descriptors
//! and lock every site out. A connection beyond the cap from one address is closed as soon as
//! it is accepted, before its TLS handshake. At the cap in total, a connection takes the place
//! of another, which is closed, only where that cannot cut a site off:
//! - an address that showed a valid token (a request passed the gate) within [`VOUCHED_FOR`]
//!   is vouched for, and none of its connections is ever closed to make room;
//! - a new connection from any address takes the place of the oldest connection of the
//!   not-vouched-for address holding the most, if that holds more than one more than the
//!   asker: a flood from a few addresses cannot keep out a site holding a few;
//! - a vouched-for address takes the place of any not-vouched-for connection.
//!
//! When the relay is full of vouched-for connections, a newcomer is refused and the refusal
//! names the token holding the most: a site flooding from many addresses with its token cut
//! another site's uploads while vouched-for connections could still be closed for each
//! other (the second review of issue 45).
//!
//! A busy sender is by nature the address holding the most: counted with the rest, a flood of
//! idle connections from a few dozen addresses closed its uploads one after another, mid-body,
//! until its batch failed (the review of issue 45). A handshake has [`Limits::handshake`] to
//! finish, and a connection that sends no request (a first one, or the next on a kept-alive
//! connection) within [`Limits::idle`] is closed.

use std::collections::{HashMap, VecDeque};
use std::future::Ready;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum_server::accept::Accept;
use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The relay's connection limits. The defaults hold under a limit of 1 024 descriptors: 768
/// connections at most leave room for the store's files, the catalogue and the listener.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once, from anywhere.
    pub total: usize,
    /// Connections open at once from one address (a NAT in front of several sites counts
    /// once: raise it there).
    pub per_address: usize,
    /// How long a TLS handshake may take.
    pub handshake: Duration,
    /// How long a connection may wait for a request's headers, the first or the next.
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            total: 768,
            // Above a sender's most uploads in flight (64, `send --connections`), with room
            // for its other requests: at 64 a sender on a long link had its 65th closed.
            per_address: 96,
            handshake: Duration::from_secs(10),
            idle: Duration::from_secs(30),
        }
    }
}

/// Descriptors the relay needs beside its connections: the listener, the store's files being
/// written and read, the catalogue, the logs.
const DESCRIPTORS_BESIDE_CONNECTIONS: u64 = 256;

impl Limits {
    /// Makes sure the process may open as many descriptors as `total` connections need,
    /// raising its soft limit up to the hard one if it must; an error that says what to change
    /// if it cannot (connections beyond the limit would fail to be accepted, unannounced, and
    /// the sites' requests wait behind them).
    pub fn fit_descriptors(&self) -> anyhow::Result<()> {
        let needed = self.total as u64 + DESCRIPTORS_BESIDE_CONNECTIONS;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills the struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return Ok(());
        }
        if limit.rlim_cur >= needed {
            return Ok(());
        }
        if limit.rlim_max >= needed {
            let raised = libc::rlimit {
                rlim_cur: needed,
                rlim_max: limit.rlim_max,
            };
            // SAFETY: setrlimit reads the struct it is given.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                tracing::info!(
                    "descriptor limit raised from {} to {needed} for {} connections",
                    limit.rlim_cur,
                    self.total
                );
                return Ok(());
            }
        }
        let most = limit.rlim_max.max(limit.rlim_cur);
        let lower = match most.checked_sub(DESCRIPTORS_BESIDE_CONNECTIONS) {
            Some(fits) if fits > 0 => format!("lower --max-connections to {fits} or less, or "),
            _ => String::new(),
        };
        anyhow::bail!(
            "--max-connections {} needs about {needed} file descriptors, but this process may open {} (ulimit -n; hard limit {}): {lower}raise the limit (LimitNOFILE= in a systemd unit)",
            self.total,
            limit.rlim_cur,
            limit.rlim_max,
        )
    }
}

/// How long an address stays vouched for after its last request with a valid token: longer
/// than a daemon's pause between batches, so that its next batch's connections are safe too.
pub const VOUCHED_FOR: Duration = Duration::from_secs(600);

/// Counts open connections and refuses those over [`Limits`].
#[derive(Clone)]
pub struct CappedAcceptor {
    limits: Limits,
    open: Arc<Mutex<Open>>,
    refusals_said: Arc<OncePerSecond>,
}

/// Says a repeated event at most once a second, with how many went unsaid since: one client
/// connecting and resetting in a loop wrote 4 278 refusal lines in 10 s (the review of
/// issue 45); the metric still counts every one.
#[derive(Debug, Default)]
struct OncePerSecond {
    /// When it last said one, and how many it left unsaid since.
    said: Mutex<Option<(Instant, u64)>>,
}

impl OncePerSecond {
    /// `Some(unsaid since the last)` if the event at `now` is to be said.
    fn say(&self, now: Instant) -> Option<u64> {
        let mut said = self.said.lock();
        match &mut *said {
            Some((at, unsaid)) if now.duration_since(*at) < Duration::from_secs(1) => {
                *unsaid += 1;
                None
            }
            _ => {
                let unsaid = said.map_or(0, |(_, n)| n);
                *said = Some((now, 0));
                Some(unsaid)
            }
        }
    }
}

#[derive(Default, Debug)]
struct Open {
    total: usize,
    /// Connections closed to make room and not gone yet.
    leaving: usize,
    /// Each address's connections, oldest first.
    by_address: HashMap<IpAddr, VecDeque<Arc<Eviction>>>,
    /// Addresses that sent a request with a valid token, when they last did, and whose token
    /// it was ("site X", "the core").
    vouched: HashMap<IpAddr, (Instant, String)>,
}

/// How a connection is told to close to make room for another.
#[derive(Debug, Default)]
struct Eviction {
    evicted: AtomicBool,
    /// The task reading or writing the connection, woken to see it.
    waker: AtomicWaker,
}

impl Eviction {
    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Whether the connection must close; its task is woken when it must, from then on.
    fn evicted(&self, cx: &Context<'_>) -> bool {
        self.waker.register(cx.waker());
        self.evicted.load(Ordering::Acquire)
    }
}

impl Open {
    /// Whose token vouched for `address` within [`VOUCHED_FOR`], if any.
    fn voucher(&self, address: &IpAddr) -> Option<&str> {
        self.vouched
            .get(address)
            .filter(|(at, _)| at.elapsed() < VOUCHED_FOR)
            .map(|(_, holder)| holder.as_str())
    }

    fn is_vouched(&self, address: &IpAddr) -> bool {
        self.voucher(address).is_some()
    }

    /// The token holding the most connections through the addresses it vouched for, and how
    /// many: what a refusal names when the relay is full.
    fn holding_most(&self) -> Option<(String, usize)> {
        let mut by_holder: HashMap<&str, usize> = HashMap::new();
        for (address, held) in &self.by_address {
            if let Some(holder) = self.voucher(address) {
                *by_holder.entry(holder).or_default() += held.len();
            }
        }
        by_holder
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(holder, n)| (holder.to_string(), n))
    }

    /// Closes a connection to make room for one from `asker`, which holds `holds` (see the
    /// module's rules): whether room was made.
    fn make_room(&mut self, asker: IpAddr, holds: usize) -> bool {
        let vouched: Vec<bool> = self
            .by_address
            .keys()
            .map(|address| self.is_vouched(address))
            .collect();
        let asker_vouched = self.is_vouched(&asker);
        // Of the addresses not vouched for, the one holding the most.
        let most = self
            .by_address
            .iter_mut()
            .zip(vouched)
            .filter(|((_, held), vouched)| !held.is_empty() && !vouched)
            .max_by_key(|((_, held), _)| held.len())
            .filter(|((_, held), _)| asker_vouched || held.len() > holds + 1);
        let Some(((address, held), _)) = most else {
            return false;
        };
        let oldest = held.pop_front().expect("addresses listed hold connections");
        tracing::warn!(
            "connection from {address} closed to make room for an address holding fewer"
        );
        oldest.evict();
        self.leaving += 1;
        true
    }
}

impl CappedAcceptor {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            open: Arc::default(),
            refusals_said: Arc::default(),
        }
    }

    /// A request from `address` showed a valid token, `holder`'s ("site X", "the core"): the
    /// address is vouched for from now on.
    pub fn vouch(&self, address: IpAddr, holder: &str) {
        let now = Instant::now();
        let mut open = self.open.lock();
        // Kept small: an entry per address that showed a token within VOUCHED_FOR.
        if open.vouched.len() >= 1024 {
            open.vouched
                .retain(|_, (at, _)| now.duration_since(*at) < VOUCHED_FOR);
        }
        let address = address.to_canonical();
        match open.vouched.get_mut(&address) {
            Some((at, known)) if known == holder => *at = now,
            _ => {
                open.vouched.insert(address, (now, holder.to_string()));
            }
        }
    }

    /// A slot for a connection from `address`, or why there is none.
    fn take(&self, address: IpAddr) -> Result<Slot, String> {
        let mut open = self.open.lock();
        let from_there = open.by_address.get(&address).map_or(0, VecDeque::len);
        if from_there >= self.limits.per_address {
            return Err(format!(
                "{from_there} connections open from {address}, the most one address may hold"
            ));
        }
        // Those leaving are still open: as many again as the cap at most, so the descriptors
        // in use stay bounded while they go.
        let staying = open.total - open.leaving;
        let full = staying >= self.limits.total;
        if full && (open.leaving >= self.limits.total || !open.make_room(address, from_there)) {
            let most = match open.holding_most() {
                Some((holder, n)) => format!("; {holder}'s token holds {n} of them"),
                None => String::new(),
            };
            return Err(format!(
                "{} connections open, the most the relay holds{most}",
                open.total
            ));
        }
        open.total += 1;
        let eviction = Arc::new(Eviction::default());
        open.by_address
            .entry(address)
            .or_default()
            .push_back(eviction.clone());
        Ok(Slot {
            open: self.open.clone(),
            address,
            eviction,
        })
    }
}

impl<S> Accept<TcpStream, S> for CappedAcceptor {
    type Stream = Counted;
    type Service = S;
    type Future = Ready<io::Result<(Counted, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        // Answers go out as written: without, a TLS ticket and the answer after it waited for
        // the client's delayed acknowledgement (about 40 ms on every fresh connection).
        let _ = stream.set_nodelay(true);
        let taken = stream
            .peer_addr()
            .map_err(|e| format!("the client was gone before it was accepted ({e})"))
            .and_then(|peer| self.take(peer.ip().to_canonical()));
        std::future::ready(match taken {
            Ok(slot) => Ok((Counted { stream, slot }, service)),
            Err(why) => {
                super::metrics::connection_refused();
                if let Some(unsaid) = self.refusals_said.say(Instant::now()) {
                    let also = match unsaid {
                        0 => String::new(),
                        n => format!(" ({n} more refused in the last second, not logged)"),
                    };
                    tracing::warn!("connection closed at once: {why}{also}");
                }
                Err(io::Error::other(why))
            }
        })
    }
}

/// A connection's place in the count, given back when it closes.
#[derive(Debug)]
struct Slot {
    open: Arc<Mutex<Open>>,
    address: IpAddr,
    eviction: Arc<Eviction>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        open.total -= 1;
        if self.eviction.evicted.load(Ordering::Acquire) {
            open.leaving -= 1;
            return;
        }
        if let Some(held) = open.by_address.get_mut(&self.address) {
            held.retain(|e| !Arc::ptr_eq(e, &self.eviction));
            if held.is_empty() {
                open.by_address.remove(&self.address);
            }
        }
    }
}

/// A counted connection.
pub struct Counted {
    stream: TcpStream,
    slot: Slot,
}

impl Counted {
    /// Whether the connection was closed to make room; then reads and writes fail.
    fn evicted(&self, cx: &Context<'_>) -> Option<io::Error> {
        self.slot.eviction.evicted(cx).then(|| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for another connection",
            )
        })
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(e) = self.evicted(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.evicted(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.evicted(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_over_the_caps_are_refused_and_slots_come_back() {
        let acceptor = CappedAcceptor::new(Limits {
            total: 3,
            per_address: 2,
            ..Limits::default()
        });
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let a1 = acceptor.take(a).unwrap();
        let _a2 = acceptor.take(a).unwrap();
        assert!(acceptor.take(a).unwrap_err().contains("from 10.0.0.1"));
        let _b1 = acceptor.take(b).unwrap();
        assert!(
            acceptor
                .take(b)
                .unwrap_err()
                .contains("the most the relay holds"),
            "b holds 1, a 2: not more than one more than b, so nothing of a's is closed"
        );
        drop(a1);
        assert!(
            acceptor.take(b).is_ok(),
            "a closed connection gives its slot back"
        );
    }

    #[test]
    fn at_the_cap_an_address_holding_few_takes_the_place_of_the_oldest_of_one_holding_most() {
        let acceptor = CappedAcceptor::new(Limits {
            total: 4,
            per_address: 4,
            ..Limits::default()
        });
        let flood: IpAddr = "10.0.0.1".parse().unwrap();
        let site: IpAddr = "10.0.0.9".parse().unwrap();
        let held: Vec<Slot> = (0..4).map(|_| acceptor.take(flood).unwrap()).collect();
        let waker = futures_util::task::noop_waker();
        let cx = Context::from_waker(&waker);
        let site_slot = acceptor.take(site).expect("the site gets a connection");
        let evicted: Vec<bool> = held.iter().map(|s| s.eviction.evicted(&cx)).collect();
        assert_eq!(
            evicted,
            [true, false, false, false],
            "the flood's oldest goes"
        );
        // The flood, still holding the most, cannot take a place back.
        assert!(acceptor.take(flood).is_err());
        drop(held);
        assert_eq!(self::open_counts(&acceptor), (1, 0));
        drop(site_slot);
        assert_eq!(self::open_counts(&acceptor), (0, 0));
    }

    #[test]
    fn no_connection_of_an_address_that_showed_a_token_is_closed_for_one_that_did_not() {
        let acceptor = CappedAcceptor::new(Limits {
            total: 6,
            per_address: 6,
            ..Limits::default()
        });
        let site: IpAddr = "10.0.0.9".parse().unwrap();
        let flood: Vec<IpAddr> = (1..=4)
            .map(|i| format!("10.0.0.{i}").parse().unwrap())
            .collect();
        let uploads: Vec<Slot> = (0..4).map(|_| acceptor.take(site).unwrap()).collect();
        acceptor.vouch(site, "site s");
        let _f1 = acceptor.take(flood[0]).unwrap();
        let _f2 = acceptor.take(flood[1]).unwrap();
        // Full: the site, busiest by far, keeps every upload; the flood's own hold one each,
        // not more than one more than the asker's none.
        for address in &flood[2..] {
            assert!(acceptor.take(*address).is_err());
        }
        let waker = futures_util::task::noop_waker();
        let cx = Context::from_waker(&waker);
        assert!(uploads.iter().all(|s| !s.eviction.evicted(&cx)));

        // The site's next connection takes the place of one that showed no token, though the
        // flood's addresses hold fewer.
        let _fifth = acceptor.take(site).expect("the site gets its connection");
        assert_eq!(self::open_counts(&acceptor), (7, 1));
        assert!(uploads.iter().all(|s| !s.eviction.evicted(&cx)));
    }

    #[test]
    fn no_vouched_for_connection_is_closed_for_another_and_a_refusal_names_the_token() {
        let acceptor = CappedAcceptor::new(Limits {
            total: 4,
            per_address: 4,
            ..Limits::default()
        });
        let (busy, other): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        acceptor.vouch(busy, "site a");
        acceptor.vouch(other, "site b");
        let held: Vec<Slot> = (0..4).map(|_| acceptor.take(busy).unwrap()).collect();
        let refused = acceptor.take(other).unwrap_err();
        assert!(refused.contains("site a's token holds 4"), "{refused}");
        let waker = futures_util::task::noop_waker();
        let cx = Context::from_waker(&waker);
        assert!(held.iter().all(|s| !s.eviction.evicted(&cx)));
        // Nor for an address that showed no token.
        assert!(acceptor.take("10.0.0.3".parse().unwrap()).is_err());
    }

    #[test]
    fn refusals_are_said_once_a_second_with_how_many_were_not() {
        let said = OncePerSecond::default();
        let start = Instant::now();
        assert_eq!(said.say(start), Some(0));
        for ms in [1, 10, 500, 999] {
            assert_eq!(said.say(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(said.say(start + Duration::from_millis(1000)), Some(4));
        assert_eq!(said.say(start + Duration::from_millis(3000)), Some(0));
    }

    /// Connections open, and those of them leaving.
    fn open_counts(acceptor: &CappedAcceptor) -> (usize, usize) {
        let open = acceptor.open.lock();
        (open.total, open.leaving)
    }
}
