//! Which zstd level suits the user's data and link: the sweep FORTE's authors ran to choose
//! zstd -3 (their Table 3 and Figure 6c), on the user's own files (`forte bench compress`).
//! `forte-bench compress` runs the same engine with gzip, lz4 and bzip2 beside zstd.
//!
//! A sample of the files (evenly spread slices, so every file counts) is cut into parts of
//! forte's part size and compressed by all cores at once, part by part, as the prepare pass
//! does. Speed is raw MB per wall second with every core busy; the predicted end-to-end rate of
//! a setting is min(speed, link × ratio), the bound the network pipeline reaches. The settings
//! no other beats in both speed and ratio form the Pareto front; the recommended one has the
//! highest predicted rate (the best ratio among those within 2 % of it).

use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use forte_daemon::units::{parse_rate, parse_size};
use forte_report::chart::{tradeoff_svg, write_svg_and_png, TradeoffPoint};

/// One codec at one level: its name and how to compress a part with it.
#[derive(Clone, Copy)]
pub struct Setting {
    /// The codec (`zstd`, the one forte compresses with; other names in comparisons).
    pub family: &'static str,
    /// Its level, for codecs that have levels.
    pub level: Option<i32>,
    /// The compressed size of a part at `level` (0 when there is none).
    pub compress: fn(&[u8], i32) -> Result<usize>,
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.level {
            Some(level) => write!(f, "{} {level}", self.family),
            None => f.write_str(self.family),
        }
    }
}

impl Setting {
    /// The compressed size of `part`.
    pub fn compress(&self, part: &[u8]) -> Result<usize> {
        (self.compress)(part, self.level.unwrap_or(0))
    }
}

fn zstd_size(part: &[u8], level: i32) -> Result<usize> {
    Ok(zstd::bulk::compress(part, level)?.len())
}

/// zstd at `level`, as forte's prepare pass compresses.
pub fn zstd(level: i32) -> Setting {
    Setting {
        family: "zstd",
        level: Some(level),
        compress: zstd_size,
    }
}

/// Every zstd level forte accepts, fastest first: -5 to -1 and 1 to 22.
pub fn zstd_levels() -> Vec<Setting> {
    (-5..=22).filter(|l| *l != 0).map(zstd).collect()
}

/// What to measure on, the link the data will cross, and where the chart goes: the flags
/// `forte bench compress` and `forte-bench compress` share.
#[derive(clap::Args)]
pub struct Options {
    /// Files or directories to sample (directories are walked; symlinks are not followed) [per run].
    #[arg(required = true, value_name = "SAMPLE")]
    pub samples: Vec<PathBuf>,
    /// The link the data will cross, for the predicted end-to-end rate (e.g. 65MB, 520mbit) [per run].
    #[arg(long, default_value = "65MB", value_parser = parse_rate)]
    pub link: f64,
    /// Bytes to measure on, taken in evenly spread 1 MiB slices of the files; `all` for all [per run].
    #[arg(long, default_value = "64MiB")]
    pub sample_size: String,
    /// Raw bytes per part, compressed independently as forte does [per run].
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    pub part_size: u64,
    /// Threads compressing parts (default: one per core) [per run].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write the speed-vs-ratio chart as DIR/compress.svg and DIR/compress.png [per run].
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
}

/// Measures `settings` on `options`' sample (progress on standard error) and prints the
/// table, the recommendation and, with `--plot`, where the chart went.
pub fn run_and_print(options: &Options, settings: Vec<Setting>) -> Result<bool> {
    let sweep = Sweep::run(options, settings, |line| eprintln!("{line}"))?;
    print!("{}", sweep.table());
    println!("\n{}", sweep.recommendation());
    if let Some(dir) = &options.plot {
        let path = sweep.chart(dir)?;
        println!("chart: {} and compress.png", path.display());
    }
    Ok(true)
}

/// One setting's measurement.
pub struct Measured {
    pub setting: Setting,
    pub mb_per_s: f64,
    pub ratio: f64,
    /// min(speed, link × ratio), MB/s.
    pub predicted: f64,
    /// No other setting is both faster and smaller.
    pub pareto: bool,
}

/// A finished sweep.
pub struct Sweep {
    /// Every setting, in the order given.
    pub measured: Vec<Measured>,
    /// The index of the recommended setting in `measured`.
    pub recommended: usize,
    sample_bytes: usize,
    threads: usize,
    link: f64,
}

impl Sweep {
    /// Samples the files and measures every setting on the sample's parts; `progress` hears a
    /// line about the sample and one per setting as it is measured.
    pub fn run(
        options: &Options,
        settings: Vec<Setting>,
        mut progress: impl FnMut(&str),
    ) -> Result<Self> {
        if settings.is_empty() {
            bail!("no setting to measure");
        }
        let threads = options
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let sample = sample(options, threads, &mut progress)?;
        let measured = measure_all(options, &settings, &sample, threads, &mut progress)?;
        Ok(Self {
            recommended: recommend(&measured),
            measured,
            sample_bytes: sample.len(),
            threads,
            link: options.link,
        })
    }

    /// The measurements as a Markdown table, one line per setting.
    pub fn table(&self) -> String {
        let link = self.link / 1e6;
        let mut out = format!(
            "| setting | MB/s ({} threads) | ratio | predicted end-to-end over {link:.1} MB/s | bound | Pareto |\n|---|---:|---:|---:|---|---|\n",
            self.threads
        );
        for m in &self.measured {
            out += &format!(
                "| {} | {:.1} | {:.3} | {:.1} MB/s | {} | {} |\n",
                m.setting,
                m.mb_per_s,
                m.ratio,
                m.predicted,
                if m.mb_per_s < link * m.ratio {
                    "CPU"
                } else {
                    "link"
                },
                if m.pareto { "●" } else { "" }
            );
        }
        out
    }

    /// The recommended setting, its rates and ratio, and the `--level` to use.
    pub fn recommendation(&self) -> String {
        let pick = &self.measured[self.recommended];
        let advice = match (pick.setting.family, pick.setting.level) {
            ("zstd", Some(level)) => format!("`--level {level}` (forte's codec is zstd)"),
            _ => format!(
                "{} — forte compresses with zstd; its best zstd level is listed above",
                pick.setting
            ),
        };
        format!(
            "recommended: {} — predicted {:.1} MB/s end to end ({:.1} MB/s of compression, ratio {:.3}); {advice}",
            pick.setting, pick.predicted, pick.mb_per_s, pick.ratio
        )
    }

    /// Writes the speed-vs-ratio chart as `dir`/compress.svg and compress.png; returns the
    /// SVG's path.
    pub fn chart(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let points: Vec<TradeoffPoint> = self
            .measured
            .iter()
            .enumerate()
            .map(|(i, m)| TradeoffPoint {
                label: m.setting.to_string(),
                family: m.setting.family.to_string(),
                ratio: m.ratio,
                mb_per_s: m.mb_per_s,
                pareto: m.pareto,
                recommended: i == self.recommended,
            })
            .collect();
        let title = format!(
            "compression speed vs ratio on {:.0} MB of your data ({} threads)",
            self.sample_bytes as f64 / 1e6,
            self.threads
        );
        let svg = tradeoff_svg(&title, &points, self.link / 1e6);
        let path = dir.join("compress.svg");
        write_svg_and_png(&svg, &path)?;
        Ok(path)
    }
}

/// Up to `--sample-size` bytes spread over the sample files.
fn sample(options: &Options, threads: usize, progress: &mut impl FnMut(&str)) -> Result<Vec<u8>> {
    let files = walk(&options.samples)?;
    let total: u64 = files.iter().map(|(_, size)| size).sum();
    if total == 0 {
        bail!("nothing to measure: the samples hold no data");
    }
    let want = if options.sample_size == "all" {
        total
    } else {
        parse_size(&options.sample_size)
            .map_err(anyhow::Error::msg)
            .context("--sample-size")?
            .min(total)
    };
    let sample = read_sample(&files, total, want)?;
    progress(&format!(
        "sample: {:.1} MB of {:.1} MB in {} files; {} parts of up to {:.0} MB on {threads} threads; link {:.1} MB/s",
        sample.len() as f64 / 1e6,
        total as f64 / 1e6,
        files.len(),
        sample.len().div_ceil(options.part_size.max(1) as usize),
        options.part_size as f64 / 1e6,
        options.link / 1e6
    ));
    Ok(sample)
}

/// Every setting on the sample's parts, and which of them are on the Pareto front.
fn measure_all(
    options: &Options,
    settings: &[Setting],
    sample: &[u8],
    threads: usize,
    progress: &mut impl FnMut(&str),
) -> Result<Vec<Measured>> {
    let parts: Vec<&[u8]> = sample.chunks(options.part_size.max(1) as usize).collect();
    let mut measured = Vec::new();
    for (i, &setting) in settings.iter().enumerate() {
        let started = Instant::now();
        let compressed = compress_parts(setting, &parts, threads)?;
        let seconds = started.elapsed().as_secs_f64();
        let mb_per_s = sample.len() as f64 / 1e6 / seconds;
        let ratio = sample.len() as f64 / compressed as f64;
        progress(&format!(
            "[{}/{}] {setting}: {mb_per_s:.1} MB/s, ratio {ratio:.3}",
            i + 1,
            settings.len()
        ));
        measured.push(Measured {
            setting,
            mb_per_s,
            ratio,
            predicted: mb_per_s.min(options.link / 1e6 * ratio),
            pareto: false,
        });
    }
    pareto_front(&mut measured);
    Ok(measured)
}

/// Marks the settings on the front: no other setting is both faster and smaller.
fn pareto_front(measured: &mut [Measured]) {
    for i in 0..measured.len() {
        let (speed, ratio) = (measured[i].mb_per_s, measured[i].ratio);
        measured[i].pareto = !measured
            .iter()
            .any(|m| m.mb_per_s > speed && m.ratio > ratio);
    }
}

/// The highest predicted rate; among settings within 2 % of it, the best ratio (fewer bytes
/// on the wire and at the relay for the same delivery rate). Its index.
fn recommend(measured: &[Measured]) -> usize {
    let best = measured.iter().map(|m| m.predicted).fold(0.0, f64::max);
    measured
        .iter()
        .enumerate()
        .filter(|(_, m)| m.predicted >= best * 0.98)
        .max_by(|(_, a), (_, b)| a.ratio.total_cmp(&b.ratio))
        .map(|(i, _)| i)
        .expect("at least one setting")
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
    fn zstd_compresses_at_every_level() {
        let data = b"sensor 42 value 17.5\n".repeat(10_000);
        let levels = zstd_levels();
        assert_eq!(levels.len(), 27);
        for s in [zstd(-3), zstd(19)] {
            let n = s.compress(&data).unwrap();
            assert!(n > 0 && n < data.len() / 10, "{s}: {n}");
        }
    }

    #[test]
    fn the_front_and_the_recommendation() {
        let at = |level, mb_per_s, ratio: f64| Measured {
            setting: zstd(level),
            mb_per_s,
            ratio,
            predicted: f64::min(mb_per_s, 100.0 * ratio),
            pareto: false,
        };
        // Link 100 MB/s: level 1 and 3 reach the same rate within 2 %, 3 packs tighter; 9 is
        // slower and no smaller than 3, so off the front.
        let mut measured = vec![at(1, 400.0, 3.0), at(3, 300.0, 3.5), at(9, 100.0, 3.4)];
        pareto_front(&mut measured);
        let front: Vec<bool> = measured.iter().map(|m| m.pareto).collect();
        assert_eq!(front, [true, true, false]);
        assert_eq!(recommend(&measured), 1);
    }
}
