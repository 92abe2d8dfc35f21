//! `forte-bench wanem`: a packet-level WAN between two network namespaces (issue 45). The
//! kernel here has no netem, so each namespace gets a TUN device (`wan0`) and this process
//! carries every IP packet between the two: each direction holds the link rate (a packet
//! leaves once the link has serialised the ones before it), delays it by half the round trip,
//! drops what overflows the bottleneck's queue, and drops at random (independently, or in
//! bursts: the Gilbert–Elliott two-state model with the given mean burst length). TCP in the
//! namespaces sees the real round trip and real loss, unlike a proxy's local connections.
//!
//! Usage (root): `ip netns add wan-a; ip netns add wan-b; forte-bench wanem --rtt 100ms
//! --loss 0.001 --rate 65MB` — then `ip netns exec wan-b …` listens on 10.77.0.2 and
//! `ip netns exec wan-a …` connects to it.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct WanEm {
    /// The two namespaces (made with `ip netns add`); the first gets 10.77.0.1, the second
    /// 10.77.0.2. `.` is the namespace this runs in (a bench's data centre on the host).
    #[arg(long, num_args = 2, default_values = ["wan-a", "wan-b"])]
    namespaces: Vec<String>,
    /// The TUN device's name on each side.
    #[arg(long, default_value = "wan0")]
    device: String,
    /// Round trip added (half each way), e.g. 100ms.
    #[arg(long, value_parser = forte_daemon::units::parse_period, default_value = "20ms")]
    rtt: Duration,
    /// Fraction of packets dropped at random, each way (0.001 is 0.1 %).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Mean length of a burst of losses (1: independent losses).
    #[arg(long, default_value_t = 1.0)]
    burst: f64,
    /// Link rate each way, bytes per second (65MB, 520mbit).
    #[arg(long, value_parser = forte_daemon::units::parse_rate, default_value = "65MB")]
    rate: f64,
    /// The bottleneck's queue, as time at the link rate: what arrives beyond it is dropped.
    #[arg(long, value_parser = forte_daemon::units::parse_period, default_value = "50ms")]
    queue: Duration,
}

/// What one direction of the link does to a packet.
struct Link {
    delay: Duration,
    rate: f64,
    queue: Duration,
    loss: Loss,
    /// When the link is next free to serialise a packet.
    free_at: Instant,
}

/// Random loss, independent or in bursts (two states: good, and bad where every packet goes).
struct Loss {
    to_bad: f64,
    to_good: f64,
    bad: bool,
    random: u64,
}

impl Loss {
    fn new(loss: f64, burst: f64, seed: u64) -> Self {
        let burst = burst.max(1.0);
        // In the long run the bad state holds a fraction `loss` of packets.
        let to_good = 1.0 / burst;
        let to_bad = if loss >= 1.0 {
            1.0
        } else {
            loss * to_good / (1.0 - loss)
        };
        Self {
            to_bad,
            to_good,
            bad: false,
            random: seed | 1,
        }
    }

    /// xorshift64*: a uniform number in [0, 1).
    fn uniform(&mut self) -> f64 {
        self.random ^= self.random >> 12;
        self.random ^= self.random << 25;
        self.random ^= self.random >> 27;
        (self.random.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn drops(&mut self) -> bool {
        let flip = if self.bad { self.to_good } else { self.to_bad };
        if self.uniform() < flip {
            self.bad = !self.bad;
        }
        self.bad
    }
}

impl Link {
    /// When a packet of `len` bytes arriving now leaves the far end, or none if it is lost.
    fn release(&mut self, len: usize, now: Instant) -> Option<Instant> {
        let start = self.free_at.max(now);
        if start.duration_since(now) > self.queue || self.loss.drops() {
            return None;
        }
        self.free_at = start + Duration::from_secs_f64(len as f64 / self.rate);
        Some(self.free_at + self.delay)
    }
}

/// Packets on their way, in the order they leave (release times only grow in one direction).
#[derive(Default)]
struct InFlight {
    packets: Mutex<VecDeque<(Instant, Vec<u8>)>>,
    arrived: Condvar,
}

pub fn run(args: WanEm) -> Result<bool> {
    let [a, b] = [&args.namespaces[0], &args.namespaces[1]];
    let tun_a = tun_in(a, &args.device, "10.77.0.1/24")?;
    let tun_b = tun_in(b, &args.device, "10.77.0.2/24")?;
    let link = |seed| Link {
        delay: args.rtt / 2,
        rate: args.rate,
        queue: args.queue,
        loss: Loss::new(args.loss, args.burst, seed),
        free_at: Instant::now(),
    };
    eprintln!(
        "wanem: {a} 10.77.0.1 <-> {b} 10.77.0.2: rtt {:?}, loss {}, burst {}, {:.1} MB/s each way, queue {:?}",
        args.rtt,
        args.loss,
        args.burst,
        args.rate / 1e6,
        args.queue
    );
    let (a_read, a_write) = (tun_a.try_clone()?, tun_a);
    let (b_read, b_write) = (tun_b.try_clone()?, tun_b);
    std::thread::scope(|s| {
        s.spawn(|| direction(a_read, b_write, link(0x9e37_79b9_7f4a_7c15)));
        s.spawn(|| direction(b_read, a_write, link(0xc2b2_ae3d_27d4_eb4f)));
    });
    Ok(true)
}

/// Carries packets from `from` to `to` through `link`, for ever.
fn direction(mut from: File, mut to: File, mut link: Link) {
    let flight = Arc::new(InFlight::default());
    let out = flight.clone();
    std::thread::spawn(move || loop {
        let (at, packet) = {
            let mut q = out.packets.lock().unwrap();
            while q.is_empty() {
                q = out.arrived.wait(q).unwrap();
            }
            q.pop_front().expect("not empty")
        };
        let wait = at.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        let _ = to.write_all(&packet);
    });
    let mut buf = vec![0u8; 65536];
    loop {
        let Ok(n) = from.read(&mut buf) else { return };
        if let Some(at) = link.release(n, Instant::now()) {
            flight
                .packets
                .lock()
                .unwrap()
                .push_back((at, buf[..n].to_vec()));
            flight.arrived.notify_one();
        }
    }
}

/// A TUN device `device` made inside the namespace `ns` (this thread enters it, then
/// returns; `.` is this one), with `address`, up.
fn tun_in(ns: &str, device: &str, address: &str) -> Result<File> {
    let here = ns == ".";
    let tun = if here {
        open_tun(device)?
    } else {
        let home = File::open("/proc/self/ns/net").context("reading this namespace")?;
        let there = File::open(format!("/var/run/netns/{ns}"))
            .with_context(|| format!("no namespace {ns}: make it with `ip netns add {ns}`"))?;
        enter(&there)?;
        let tun = open_tun(device);
        enter(&home)?;
        tun?
    };
    let in_ns: &[&str] = if here { &[] } else { &["-n", ns] };
    for args in [
        vec!["addr", "add", address, "dev", device],
        vec!["link", "set", device, "up", "mtu", "1500"],
        vec!["link", "set", "lo", "up"],
    ] {
        let status = std::process::Command::new("ip")
            .args(in_ns)
            .args(&args)
            .status()?;
        if !status.success() {
            bail!("ip {} {} failed", in_ns.join(" "), args.join(" "));
        }
    }
    Ok(tun)
}

fn enter(ns: &File) -> Result<()> {
    // SAFETY: setns on a namespace file we hold open.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn open_tun(name: &str) -> Result<File> {
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .context("opening /dev/net/tun")?;
    let mut ifr = [0u8; 40];
    ifr[..name.len()].copy_from_slice(name.as_bytes());
    let flags = (libc::IFF_TUN | libc::IFF_NO_PI) as u16;
    ifr[16..18].copy_from_slice(&flags.to_ne_bytes());
    const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
    // SAFETY: TUNSETIFF reads an ifreq (name, flags) from a buffer of ifreq's size.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, ifr.as_mut_ptr()) } != 0 {
        bail!("TUNSETIFF {name}: {}", std::io::Error::last_os_error());
    }
    Ok(tun)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_come_at_the_given_rate_and_in_bursts_of_the_given_length() {
        for (p, burst) in [(0.001, 1.0), (0.01, 1.0), (0.01, 4.0)] {
            let mut loss = Loss::new(p, burst, 42);
            let n = 2_000_000;
            let (mut lost, mut bursts, mut was) = (0, 0, false);
            for _ in 0..n {
                let now = loss.drops();
                lost += now as u32;
                bursts += (now && !was) as u32;
                was = now;
            }
            let rate = lost as f64 / n as f64;
            assert!((rate - p).abs() < p * 0.1, "{p} {burst}: {rate}");
            let mean = lost as f64 / bursts as f64;
            assert!(
                (mean - burst).abs() < burst * 0.1 + 0.05,
                "{p} {burst}: bursts of {mean}"
            );
        }
    }

    #[test]
    fn the_link_holds_its_rate_and_its_queue() {
        let now = Instant::now();
        let mut link = Link {
            delay: Duration::from_millis(50),
            rate: 1e6,
            queue: Duration::from_millis(10),
            loss: Loss::new(0.0, 1.0, 1),
            free_at: now,
        };
        // 1 000 bytes take 1 ms at 1 MB/s: ten fit the 10 ms queue, the rest are dropped.
        let released: Vec<_> = (0..20).filter_map(|_| link.release(1000, now)).collect();
        assert_eq!(released.len(), 11);
        assert_eq!(released[0], now + Duration::from_millis(51));
        assert_eq!(released[10], now + Duration::from_millis(61));
    }
}
