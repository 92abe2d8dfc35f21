//! `forte-bench compress`: the sweep FORTE's authors ran to choose zstd -3 (their Table 3 and
//! Figure 6c), with every codec they compared: `forte bench compress`'s engine
//! (`forte_edge::level_sweep`: sampling, parallel parts, the Pareto front, the recommendation,
//! the chart) over zstd's levels, lz4, gzip's levels and, with --bzip2, bzip2's.

use std::io::Write;

use anyhow::Result;
use forte_edge::level_sweep::{self, Options, Setting};

#[derive(clap::Args)]
pub struct CompressBench {
    #[command(flatten)]
    options: Options,
    /// Also bzip2 levels 1–9 (slow: minutes on a large sample).
    #[arg(long)]
    bzip2: bool,
}

pub fn run(b: CompressBench) -> Result<bool> {
    level_sweep::run_and_print(&b.options, settings(b.bzip2))
}

/// zstd -5 to 22, lz4, gzip 1 to 9, and bzip2 1 to 9 if asked: FORTE's sweep.
fn settings(bzip2: bool) -> Vec<Setting> {
    let mut settings = level_sweep::zstd_levels();
    settings.push(LZ4);
    settings.extend((1..=9).map(gzip));
    if bzip2 {
        settings.extend((1..=9).map(bzip2_at));
    }
    settings
}

const LZ4: Setting = Setting {
    family: "lz4",
    level: None,
    compress: |part, _| Ok(lz4_flex::block::compress(part).len()),
};

fn gzip(level: i32) -> Setting {
    Setting {
        family: "gzip",
        level: Some(level),
        compress: |part, level| {
            let mut out = flate2::write::GzEncoder::new(
                Vec::with_capacity(part.len() / 2),
                flate2::Compression::new(level as u32),
            );
            out.write_all(part)?;
            Ok(out.finish()?.len())
        },
    }
}

fn bzip2_at(level: i32) -> Setting {
    Setting {
        family: "bzip2",
        level: Some(level),
        compress: |part, level| {
            let mut out = bzip2::write::BzEncoder::new(
                Vec::with_capacity(part.len() / 2),
                bzip2::Compression::new(level as u32),
            );
            out.write_all(part)?;
            Ok(out.finish()?.len())
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_compresses() {
        let data = b"sensor 42 value 17.5\n".repeat(10_000);
        for s in [
            level_sweep::zstd(-3),
            level_sweep::zstd(19),
            gzip(6),
            LZ4,
            bzip2_at(9),
        ] {
            let n = s.compress(&data).unwrap();
            assert!(n > 0 && n < data.len() / 10, "{s}: {n}");
        }
    }

    #[test]
    fn the_sweep_is_fortes() {
        let names =
            |bzip2| -> Vec<String> { settings(bzip2).iter().map(|s| s.to_string()).collect() };
        let all = names(true);
        assert_eq!(names(false).len(), 27 + 1 + 9);
        assert_eq!(all.len(), 27 + 1 + 9 + 9);
        for name in ["zstd -5", "zstd 22", "lz4", "gzip 1", "gzip 9", "bzip2 9"] {
            assert!(all.iter().any(|n| n == name), "{name}");
        }
    }
}
