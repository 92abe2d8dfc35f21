//! A TCP proxy that injects network faults between two forte roles: connections reset in the
//! middle of a transfer, a link that collapses to a few kB/s, a peer that is down. The faults
//! apply to live connections as well as new ones, as a real network's would.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Bytes flow freely.
    None,
    /// Every open connection is reset and new ones are refused.
    Down,
    /// At most this many bytes per second in each direction of each connection.
    Throttle(u64),
    /// Connections stay open but no byte moves.
    Stall,
}

pub struct FaultProxy {
    pub addr: String,
    fault: Arc<Mutex<Fault>>,
    /// Bumped to reset every connection open at that moment.
    generation: Arc<AtomicU64>,
    /// Bytes carried towards the target.
    pub forwarded: Arc<AtomicU64>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `target` (`host:port`).
    pub fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let fault = Arc::new(Mutex::new(Fault::None));
        let generation = Arc::new(AtomicU64::new(0));
        let forwarded = Arc::new(AtomicU64::new(0));
        let target = target.to_string();
        let (f, g, n) = (fault.clone(), generation.clone(), forwarded.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if *f.lock().unwrap() == Fault::Down {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let born = g.load(Ordering::SeqCst);
                for (from, to, count) in [
                    (
                        client.try_clone().unwrap(),
                        server.try_clone().unwrap(),
                        Some(n.clone()),
                    ),
                    (server, client, None),
                ] {
                    let (f, g) = (f.clone(), g.clone());
                    std::thread::spawn(move || pump(from, to, &f, &g, born, count));
                }
            }
        });
        Self {
            addr,
            fault,
            generation,
            forwarded,
        }
    }

    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
        if fault == Fault::Down {
            self.reset_all();
        }
    }

    /// Resets every connection open now (new ones go through).
    pub fn reset_all(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    fault: &Mutex<Fault>,
    generation: &AtomicU64,
    born: u64,
    count: Option<Arc<AtomicU64>>,
) {
    from.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        if generation.load(Ordering::SeqCst) != born {
            break;
        }
        let current = *fault.lock().unwrap();
        if current == Fault::Stall {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let chunk = match current {
            Fault::Throttle(rate) => (rate as usize / 20).clamp(1, buf.len()),
            _ => buf.len(),
        };
        match from.read(&mut buf[..chunk]) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                if let Some(c) = &count {
                    c.fetch_add(n as u64, Ordering::Relaxed);
                }
                if let Fault::Throttle(_) = current {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    // A reset, as a dropped link looks to both ends.
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
