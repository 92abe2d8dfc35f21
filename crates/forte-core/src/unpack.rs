//! `unpack`: a directory of sealed objects written by `pack` restored, all or nothing, offline.
//! The network path (`pull`) restores the same objects as the relay hands them over.

use std::path::Path;
use std::sync::atomic::Ordering;

use anyhow::Result;
use forte_daemon::progress::{with_progress, Shown};
use forte_daemon::settings::CoreSettings;
use forte_daemon::units::human;
use forte_pipeline::Reading;
use forte_restore::{Delivered, DirSource, Restore};

/// Restores the archive `dir` into `to`, all or nothing, with the pipeline's reading.
pub fn unpack(
    dir: &Path,
    to: &Path,
    core: CoreSettings,
    quiet: bool,
) -> Result<(Delivered, Reading)> {
    let trusted = core.trusted.current();
    let restore = Restore::new(core.restore, &core.identities, &trusted);
    let total = dir_size(dir);
    let delivered = with_progress(
        total,
        quiet,
        || {
            let t = &restore.totals;
            Shown {
                bytes: t.sealed_bytes.load(Ordering::Relaxed),
                message: format!("restored {}", human(t.raw_bytes.load(Ordering::Relaxed))),
            }
        },
        || {
            restore.run(
                &DirSource {
                    root: dir.to_path_buf(),
                },
                to,
                &|m| Ok(m.path.clone()),
            )
        },
    )?;
    Ok((delivered, restore.pipeline.reading()))
}

/// Bytes under `dir`, one level of object directories deep: the progress bar's total.
fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_dir(e.path()).ok())
        .flat_map(|files| files.flatten())
        .filter_map(|f| f.metadata().ok())
        .map(|m| m.len())
        .sum()
}
