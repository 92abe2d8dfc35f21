//! `forte bench compress`: the sweep FORTE's authors ran to choose zstd -3 (their Table 3 and
//! Figure 6c), on the user's own files, in one command.
//!
//! A sample of the files (evenly spread slices, so every file counts) is cut into parts of
//! forte's part size and compressed by all cores at once, part by part, as the prepare pass
//! does. Speed is raw MB per wall second with every core busy; the predicted end-to-end rate of
//! a setting is min(speed, link × ratio), the bound the network pipeline reaches.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use forte_report::chart::{tradeoff_svg, write_svg_and_png, TradeoffPoint};

use forte_daemon::units::{parse_rate, parse_size};

#[derive(clap::Args)]
pub struct CompressBench {
    /// Files or directories to sample (directories are walked; symlinks are not followed).
    #[arg(required = true, value_name = "SAMPLE")]
    samples: Vec<PathBuf>,
    /// The link the data will cross, for the predicted end-to-end rate (e.g. 65MB, 520mbit).
    #[arg(long, default_value = "65MB", value_parser = parse_rate)]
    link: f64,
    /// Bytes to measure on, taken in evenly spread 1 MiB slices of the files; `all` for all.
    #[arg(long, default_value = "64MiB")]
    sample_size: String,
    /// Raw bytes per part, compressed independently as forte does.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    part_size: u64,
    /// Threads compressing parts (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Also bzip2 levels 1–9 (slow: minutes on a large sample).
    #[arg(long)]
    bzip2: bool,
    /// Write the speed-vs-ratio chart as DIR/compress.svg and DIR/compress.png.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
}

/// One codec setting.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Setting {
    Zstd(i32),
    Gzip(u32),
    Lz4,
    Bzip2(u32),
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Setting::Zstd(l) => write!(f, "zstd {l}"),
            Setting::Gzip(l) => write!(f, "gzip {l}"),
            Setting::Lz4 => f.write_str("lz4"),
            Setting::Bzip2(l) => write!(f, "bzip2 {l}"),
        }
    }
}

impl Setting {
    fn family(self) -> &'static str {
        match self {
            Setting::Zstd(_) => "zstd",
            Setting::Gzip(_) => "gzip",
            Setting::Lz4 => "lz4",
            Setting::Bzip2(_) => "bzip2",
        }
    }

    /// Compressed size of `part`.
    fn compress(self, part: &[u8]) -> Result<usize> {
        Ok(match self {
            Setting::Zstd(level) => zstd::bulk::compress(part, level)?.len(),
            Setting::Gzip(level) => {
                let mut out = flate2::write::GzEncoder::new(
                    Vec::with_capacity(part.len() / 2),
                    flate2::Compression::new(level),
                );
                out.write_all(part)?;
                out.finish()?.len()
            }
            Setting::Lz4 => lz4_flex::block::compress(part).len(),
            Setting::Bzip2(level) => {
                let mut out = bzip2::write::BzEncoder::new(
                    Vec::with_capacity(part.len() / 2),
                    bzip2::Compression::new(level),
                );
                out.write_all(part)?;
                out.finish()?.len()
            }
        })
    }
}

struct Measured {
    setting: Setting,
    mb_per_s: f64,
    ratio: f64,
    predicted: f64,
    pareto: bool,
}

pub fn run(b: CompressBench) -> Result<bool> {
    let threads = b
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let sample = sample(&b, threads)?;
    let measured = measure_all(&b, &sample, threads)?;
    print_table(&b, &measured, threads);
    let recommended = recommend(&measured);
    if let Some(dir) = &b.plot {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let points: Vec<TradeoffPoint> = measured
            .iter()
            .map(|m| TradeoffPoint {
                label: m.setting.to_string(),
                family: m.setting.family().to_string(),
                ratio: m.ratio,
                mb_per_s: m.mb_per_s,
                pareto: m.pareto,
                recommended: std::ptr::eq(m, recommended),
            })
            .collect();
        let title = format!(
            "compression speed vs ratio on {:.0} MB of your data ({threads} threads)",
            sample.len() as f64 / 1e6
        );
        let svg = tradeoff_svg(&title, &points, b.link / 1e6);
        let path = dir.join("compress.svg");
        write_svg_and_png(&svg, &path)?;
        println!("chart: {} and compress.png", path.display());
    }
    Ok(true)
}

/// Up to `--sample-size` bytes spread over the sample files.
fn sample(b: &CompressBench, threads: usize) -> Result<Vec<u8>> {
    let files = walk(&b.samples)?;
    let total: u64 = files.iter().map(|(_, size)| size).sum();
    if total == 0 {
        bail!("nothing to measure: the samples hold no data");
    }
    let want = if b.sample_size == "all" {
        total
    } else {
        parse_size(&b.sample_size)
            .map_err(anyhow::Error::msg)
            .context("--sample-size")?
            .min(total)
    };
    let sample = read_sample(&files, total, want)?;
    eprintln!(
        "sample: {:.1} MB of {:.1} MB in {} files; {} parts of up to {:.0} MB on {threads} threads; link {:.1} MB/s",
        sample.len() as f64 / 1e6,
        total as f64 / 1e6,
        files.len(),
        sample.len().div_ceil(b.part_size.max(1) as usize),
        b.part_size as f64 / 1e6,
        b.link / 1e6
    );
    Ok(sample)
}

/// Every setting on the sample's parts, and which of them are on the Pareto front.
fn measure_all(b: &CompressBench, sample: &[u8], threads: usize) -> Result<Vec<Measured>> {
    let parts: Vec<&[u8]> = sample.chunks(b.part_size.max(1) as usize).collect();
    let mut settings: Vec<Setting> = (-5..=22).filter(|l| *l != 0).map(Setting::Zstd).collect();
    settings.push(Setting::Lz4);
    settings.extend((1..=9).map(Setting::Gzip));
    if b.bzip2 {
        settings.extend((1..=9).map(Setting::Bzip2));
    }
    let mut measured = Vec::new();
    for (i, &setting) in settings.iter().enumerate() {
        let started = Instant::now();
        let compressed = compress_parts(setting, &parts, threads)?;
        let seconds = started.elapsed().as_secs_f64();
        let mb_per_s = sample.len() as f64 / 1e6 / seconds;
        let ratio = sample.len() as f64 / compressed as f64;
        eprintln!(
            "[{}/{}] {setting}: {mb_per_s:.1} MB/s, ratio {ratio:.3}",
            i + 1,
            settings.len()
        );
        measured.push(Measured {
            setting,
            mb_per_s,
            ratio,
            predicted: mb_per_s.min(b.link / 1e6 * ratio),
            pareto: false,
        });
    }
    // On the front: no other setting is both faster and smaller.
    for i in 0..measured.len() {
        let (speed, ratio) = (measured[i].mb_per_s, measured[i].ratio);
        measured[i].pareto = !measured
            .iter()
            .any(|m| m.mb_per_s > speed && m.ratio > ratio);
    }
    Ok(measured)
}

fn print_table(b: &CompressBench, measured: &[Measured], threads: usize) {
    println!(
        "| setting | MB/s ({threads} threads) | ratio | predicted end-to-end over {:.1} MB/s | bound | Pareto |",
        b.link / 1e6
    );
    println!("|---|---:|---:|---:|---|---|");
    for m in measured {
        println!(
            "| {} | {:.1} | {:.3} | {:.1} MB/s | {} | {} |",
            m.setting,
            m.mb_per_s,
            m.ratio,
            m.predicted,
            if m.mb_per_s < b.link / 1e6 * m.ratio {
                "CPU"
            } else {
                "link"
            },
            if m.pareto { "●" } else { "" }
        );
    }
}

/// The highest predicted rate; among settings within 2 % of it, the best ratio (fewer bytes
/// on the wire and at the relay for the same delivery rate). Prints it, and returns it.
fn recommend(measured: &[Measured]) -> &Measured {
    let best = measured.iter().map(|m| m.predicted).fold(0.0, f64::max);
    let pick = measured
        .iter()
        .filter(|m| m.predicted >= best * 0.98)
        .max_by(|a, b| a.ratio.total_cmp(&b.ratio))
        .expect("at least one setting");
    let advice = match pick.setting {
        Setting::Zstd(level) => format!("`--level {level}` (forte's codec is zstd)"),
        other => {
            format!("{other} — forte compresses with zstd; its best zstd level is listed above")
        }
    };
    println!(
        "\nrecommended: {} — predicted {:.1} MB/s end to end ({:.1} MB/s of compression, ratio {:.3}); {advice}",
        pick.setting, pick.predicted, pick.mb_per_s, pick.ratio
    );
    pick
}

/// Total compressed size of `parts`, compressed by `threads` workers taking parts in turn.
fn compress_parts(setting: Setting, parts: &[&[u8]], threads: usize) -> Result<usize> {
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| -> Result<usize> {
                    let mut sum = 0;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(part) = parts.get(i) else { break };
                        sum += setting.compress(part)?;
                    }
                    Ok(sum)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a compressing thread"))
            .sum()
    })
}

/// Regular files under `roots` with their sizes, sorted by path.
fn walk(roots: &[PathBuf]) -> Result<Vec<(PathBuf, u64)>> {
    let mut files = Vec::new();
    let mut stack: Vec<PathBuf> = roots.to_vec();
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)
                .with_context(|| format!("cannot list {}", path.display()))?
            {
                stack.push(entry?.path());
            }
        } else if meta.is_file() {
            files.push((path, meta.len()));
        }
    }
    files.sort();
    Ok(files)
}

/// `want` bytes of the files seen as one stream: evenly spaced 1 MiB slices (all of it when
/// `want` is the total), so that every kind of file in the sample is measured.
fn read_sample(files: &[(PathBuf, u64)], total: u64, want: u64) -> Result<Vec<u8>> {
    const SLICE: u64 = 1 << 20;
    let slices = want.div_ceil(SLICE).max(1);
    let stride = if want >= total { SLICE } else { total / slices };
    let mut out = Vec::with_capacity(want as usize);
    let (mut file_start, mut index) = (0u64, 0usize);
    let mut at = 0u64;
    while at < total && (out.len() as u64) < want {
        while file_start + files[index].1 <= at {
            file_start += files[index].1;
            index += 1;
        }
        let (path, size) = &files[index];
        let offset = at - file_start;
        let take = SLICE.min(size - offset).min(want - out.len() as u64);
        let mut f =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        f.seek(SeekFrom::Start(offset))?;
        let before = out.len();
        f.take(take)
            .read_to_end(&mut out)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if out.len() == before {
            bail!("{} shrank while being read", path.display());
        }
        at += stride.max(take);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_spreads_over_every_file() {
        let dir = tempfile::tempdir().unwrap();
        for (name, byte) in [("a", b'a'), ("b", b'b'), ("c", b'c')] {
            std::fs::write(dir.path().join(name), vec![byte; 3 << 20]).unwrap();
        }
        let files = walk(&[dir.path().to_path_buf()]).unwrap();
        let sample = read_sample(&files, 9 << 20, 3 << 20).unwrap();
        assert_eq!(sample.len(), 3 << 20);
        for byte in [b'a', b'b', b'c'] {
            assert!(sample.contains(&byte), "{}", byte as char);
        }
        let all = read_sample(&files, 9 << 20, 9 << 20).unwrap();
        assert_eq!(all.len(), 9 << 20);
    }

    #[test]
    fn every_codec_compresses() {
        let data = b"sensor 42 value 17.5\n".repeat(10_000);
        for s in [
            Setting::Zstd(-3),
            Setting::Zstd(19),
            Setting::Gzip(6),
            Setting::Lz4,
            Setting::Bzip2(9),
        ] {
            let n = s.compress(&data).unwrap();
            assert!(n > 0 && n < data.len() / 10, "{s}: {n}");
        }
    }
}
