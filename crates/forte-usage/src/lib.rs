//! Resource utilisation of this machine, as FORTE measures it: CPU, memory, disk read/write and
//! network receive/send, sampled once a second while a transfer runs.
//!
//! Read straight from Linux's `/proc` counters (`stat`, `meminfo`, `diskstats`, `net/dev`):
//! system-wide disk I/O is not available from the portable crates (sysinfo reports disk I/O per
//! process only), and one source keeps the numbers consistent with each other.

use std::sync::mpsc::{RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

/// This machine's host name (`/proc/sys/kernel/hostname`), or `localhost` when unreadable.
pub fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    match name.trim() {
        "" => "localhost".to_string(),
        name => name.to_string(),
    }
}

/// Whether a process `pid` runs on this machine now.
pub fn process_alive(pid: u32) -> bool {
    std::path::Path::new("/proc").join(pid.to_string()).exists()
}

/// Cumulative counters at one instant.
#[derive(Debug, Clone)]
pub struct Counters {
    at: Instant,
    cpu_busy: u64,
    cpu_total: u64,
    /// This process's CPU time so far (user + system), in the same clock ticks.
    own_cpu: u64,
    disk_read_bytes: u64,
    disk_write_bytes: u64,
    net_rx_bytes: u64,
    net_tx_bytes: u64,
}

/// Utilisation over one interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds the interval lasted.
    pub seconds: f64,
    /// Share of all cores busy, 0–100.
    pub cpu_percent: f64,
    pub memory_used_bytes: u64,
    /// This process's share of all cores, 0–100: its part of `cpu_percent`.
    pub own_cpu_percent: f64,
    /// This process's resident memory: its part of `memory_used_bytes`.
    pub own_memory_bytes: u64,
    pub disk_read_bytes_per_sec: f64,
    pub disk_write_bytes_per_sec: f64,
    /// Over every interface but loopback.
    pub net_rx_bytes_per_sec: f64,
    pub net_tx_bytes_per_sec: f64,
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))
}

fn numbers(fields: &[&str]) -> Vec<u64> {
    fields.iter().map(|f| f.parse().unwrap_or(0)).collect()
}

/// The machine's CPU time so far, all cores, in clock ticks: (busy, total). Their differences
/// over an interval give the share of the machine busy, whoever kept it busy.
pub fn cpu_ticks() -> Result<(u64, u64)> {
    let stat = read("/proc/stat")?;
    let cpu: Vec<u64> = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .map(|rest| numbers(&rest.split_whitespace().collect::<Vec<_>>()))
        .context("/proc/stat has no cpu line")?;
    // user nice system idle iowait irq softirq steal: idle and iowait are not busy.
    let total: u64 = cpu.iter().take(8).sum();
    let idle = cpu.get(3).copied().unwrap_or(0) + cpu.get(4).copied().unwrap_or(0);
    Ok((total.saturating_sub(idle), total))
}

impl Counters {
    pub fn now() -> Result<Self> {
        let (cpu_busy, cpu_total) = cpu_ticks()?;
        let own_cpu = own_cpu_ticks()?;

        let (mut disk_read_bytes, mut disk_write_bytes) = (0, 0);
        for line in read("/proc/diskstats")?.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let Some(name) = f.get(2) else { continue };
            // Whole disks only (partitions would count twice), no loop or RAM devices.
            let whole = std::path::Path::new("/sys/block").join(name).exists();
            if !whole || name.starts_with("loop") || name.starts_with("ram") || f.len() < 10 {
                continue;
            }
            let n = numbers(&f[3..10]);
            disk_read_bytes += n[2] * 512;
            disk_write_bytes += n[6] * 512;
        }

        let (mut net_rx_bytes, mut net_tx_bytes) = (0, 0);
        for line in read("/proc/net/dev")?.lines().skip(2) {
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            if name.trim() == "lo" {
                continue;
            }
            let n = numbers(&rest.split_whitespace().collect::<Vec<_>>());
            net_rx_bytes += n.first().copied().unwrap_or(0);
            net_tx_bytes += n.get(8).copied().unwrap_or(0);
        }
        Ok(Self {
            at: Instant::now(),
            cpu_busy,
            cpu_total,
            own_cpu,
            disk_read_bytes,
            disk_write_bytes,
            net_rx_bytes,
            net_tx_bytes,
        })
    }

    /// Utilisation from `earlier` to `self`.
    pub fn since(&self, earlier: &Counters) -> Result<Sample> {
        let seconds = self.at.duration_since(earlier.at).as_secs_f64().max(1e-6);
        let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / seconds;
        let total = self.cpu_total.saturating_sub(earlier.cpu_total);
        let busy = self.cpu_busy.saturating_sub(earlier.cpu_busy);
        // The machine's and the process's ticks are counted apart: over a short interval the
        // process can show a tick the machine has not yet, but its share is part of the busy.
        let own = self.own_cpu.saturating_sub(earlier.own_cpu).min(busy);
        let share = |ticks: u64| match total {
            0 => 0.0,
            total => 100.0 * ticks as f64 / total as f64,
        };
        Ok(Sample {
            seconds,
            cpu_percent: share(busy),
            memory_used_bytes: memory_used()?,
            own_cpu_percent: share(own),
            own_memory_bytes: own_memory()?,
            disk_read_bytes_per_sec: rate(self.disk_read_bytes, earlier.disk_read_bytes),
            disk_write_bytes_per_sec: rate(self.disk_write_bytes, earlier.disk_write_bytes),
            net_rx_bytes_per_sec: rate(self.net_rx_bytes, earlier.net_rx_bytes),
            net_tx_bytes_per_sec: rate(self.net_tx_bytes, earlier.net_tx_bytes),
        })
    }
}

/// This process's CPU time so far, user and system, in clock ticks (`/proc/self/stat`, the
/// 14th and 15th fields, counted after the command name, which may hold spaces).
fn own_cpu_ticks() -> Result<u64> {
    let stat = read("/proc/self/stat")?;
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("/proc/self/stat has no command name")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let n = numbers(fields.get(11..13).context("/proc/self/stat is too short")?);
    Ok(n.iter().sum())
}

/// This process's resident memory (`VmRSS`), in bytes.
fn own_memory() -> Result<u64> {
    let status = read("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    Ok(kib * 1024)
}

/// MemTotal − MemAvailable, in bytes.
fn memory_used() -> Result<u64> {
    let info = read("/proc/meminfo")?;
    let field = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(field("MemTotal:").saturating_sub(field("MemAvailable:")) * 1024)
}

/// Samples every `interval` on a thread of its own, handing each sample to `record`, until
/// dropped; dropping records the last, shorter interval too, so every run has a sample.
pub struct Sampler {
    stop: Option<Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    pub fn start(interval: Duration, record: impl Fn(Sample) + Send + 'static) -> Result<Self> {
        let mut last = Counters::now()?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("forte-usage".into())
            .spawn(move || loop {
                let done = stopped.recv_timeout(interval) != Err(RecvTimeoutError::Timeout);
                if let Ok(now) = Counters::now() {
                    if let Ok(sample) = now.since(&last) {
                        record(sample);
                    }
                    last = now;
                }
                if done {
                    break;
                }
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn samples_are_plausible_and_every_run_has_one() {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sink = samples.clone();
        let sampler = Sampler::start(Duration::from_millis(100), move |s| {
            sink.lock().unwrap().push(s)
        })
        .unwrap();
        // Some CPU and disk work to measure.
        let mut x = 0u64;
        let until = Instant::now() + Duration::from_millis(350);
        while Instant::now() < until {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        drop(sampler);
        let samples = samples.lock().unwrap();
        assert!(samples.len() >= 3, "{samples:?}");
        for s in samples.iter() {
            assert!((0.0..=100.0).contains(&s.cpu_percent), "{s:?}");
            assert!(s.memory_used_bytes > 0 && s.seconds > 0.0, "{s:?}");
        }
        // One core of two was kept busy: the machine was well above idle, by this process.
        assert!(samples.iter().any(|s| s.cpu_percent > 20.0), "{samples:?}");
        assert!(
            samples.iter().any(|s| s.own_cpu_percent > 20.0),
            "{samples:?}"
        );
        for s in samples.iter() {
            assert!(s.own_cpu_percent <= s.cpu_percent + 5.0, "{s:?}");
            let own = s.own_memory_bytes;
            assert!(own > 0 && own <= s.memory_used_bytes, "{s:?}");
        }
    }
}
