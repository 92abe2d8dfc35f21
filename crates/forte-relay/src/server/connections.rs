//! How many connections the relay holds, and for how long: a client that opens connections
//! and sends nothing (no token is needed to open one) must not use up the relay's descriptors
//! and lock every site out. A connection beyond the cap from one address is closed as soon as
//! it is accepted, before its TLS handshake. At the cap in total, a connection from an address
//! holding fewer connections than the address holding the most takes the place of that
//! address's oldest connection, which is closed: whoever holds many connections from a few
//! addresses cannot keep out a site that holds a few (a flood from as many addresses as the cap
//! is beyond what a relay alone can tell from sites). A handshake has [`Limits::handshake`] to
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
use std::time::Duration;

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

/// Counts open connections and refuses those over [`Limits`].
#[derive(Clone)]
pub struct CappedAcceptor {
    limits: Limits,
    open: Arc<Mutex<Open>>,
}

#[derive(Default, Debug)]
struct Open {
    total: usize,
    /// Connections closed to make room and not gone yet.
    leaving: usize,
    /// Each address's connections, oldest first.
    by_address: HashMap<IpAddr, VecDeque<Arc<Eviction>>>,
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
    /// Closes the oldest connection of the address holding the most, if it holds more than
    /// `holds` (what the address asking for room holds): whether room was made.
    fn make_room(&mut self, holds: usize) -> bool {
        let most = self
            .by_address
            .iter_mut()
            .max_by_key(|(_, held)| held.len())
            .filter(|(_, held)| held.len() > holds + 1);
        let Some((address, held)) = most else {
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
        if full && (open.leaving >= self.limits.total || !open.make_room(from_there)) {
            return Err(format!(
                "{} connections open, the most the relay holds",
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
            .map_err(|e| e.to_string())
            .and_then(|peer| self.take(peer.ip().to_canonical()));
        std::future::ready(match taken {
            Ok(slot) => Ok((Counted { stream, slot }, service)),
            Err(why) => {
                super::metrics::connection_refused();
                tracing::warn!("connection closed at once: {why}");
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

    /// Connections open, and those of them leaving.
    fn open_counts(acceptor: &CappedAcceptor) -> (usize, usize) {
        let open = acceptor.open.lock();
        (open.total, open.leaving)
    }
}
