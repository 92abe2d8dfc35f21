//! How many connections the relay holds, and for how long: a client that opens connections
//! and sends nothing (no token is needed to open one) must not use up the relay's descriptors
//! and lock every site out. A connection beyond the cap, in total or from one address, is
//! closed as soon as it is accepted, before its TLS handshake; a handshake has
//! [`Limits::handshake`] to finish, and a connection that sends no request (a first one, or the
//! next on a kept-alive connection) within [`Limits::idle`] is closed.

use std::collections::HashMap;
use std::future::Ready;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum_server::accept::Accept;
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
            per_address: 64,
            handshake: Duration::from_secs(10),
            idle: Duration::from_secs(30),
        }
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
    by_address: HashMap<IpAddr, usize>,
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
        let from_there = open.by_address.get(&address).copied().unwrap_or(0);
        if open.total >= self.limits.total {
            return Err(format!(
                "{} connections open, the most the relay holds",
                open.total
            ));
        }
        if from_there >= self.limits.per_address {
            return Err(format!(
                "{from_there} connections open from {address}, the most one address may hold"
            ));
        }
        open.total += 1;
        *open.by_address.entry(address).or_default() += 1;
        Ok(Slot {
            open: self.open.clone(),
            address,
        })
    }
}

impl<S> Accept<TcpStream, S> for CappedAcceptor {
    type Stream = Counted;
    type Service = S;
    type Future = Ready<io::Result<(Counted, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let taken = stream
            .peer_addr()
            .map_err(|e| e.to_string())
            .and_then(|peer| self.take(peer.ip().to_canonical()));
        std::future::ready(match taken {
            Ok(slot) => Ok((
                Counted {
                    stream,
                    _slot: slot,
                },
                service,
            )),
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
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        open.total -= 1;
        if let Some(n) = open.by_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                open.by_address.remove(&self.address);
            }
        }
    }
}

/// A counted connection.
pub struct Counted {
    stream: TcpStream,
    _slot: Slot,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
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
        assert!(acceptor
            .take(b)
            .unwrap_err()
            .contains("the most the relay holds"));
        drop(a1);
        assert!(
            acceptor.take(b).is_ok(),
            "a closed connection gives its slot back"
        );
    }
}
