//! How a restore runs: its parallelism and what it does with files already at the destination.

use forte_pipeline::Scheduling;

/// Knobs of the restore path.
#[derive(Debug, Clone)]
pub struct RestoreConfig {
    pub cpu: usize,
    /// Parts between being read and being written; bounds memory as in the prepare path.
    pub parts_in_flight: usize,
    /// What to do about files that already exist at the destination.
    pub existing: Existing,
    /// Objects read at once: 1 for a local disk; more for a remote source, where each read
    /// is a round trip (one object's parts are always read in order).
    pub readers: usize,
    /// Files written to the destination at once.
    pub writers: usize,
    /// Who runs the computing stages.
    pub scheduling: Scheduling,
}

/// Files already at the destination. In every mode a directory where a file is to go (or a
/// file, link or device where a directory is to go) refuses the whole restore, and the
/// message says to move it away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Refuse the whole restore; the message points to `--overwrite` (`unpack`).
    Refuse,
    /// Replace them (`unpack --overwrite`).
    Overwrite,
    /// Keep a file whose SHA-256 equals the manifest's (an earlier delivery whose
    /// acknowledgement was lost); refuse others, saying to move them away (`pull`, which has
    /// no `--overwrite`).
    KeepIdentical,
}

impl RestoreConfig {
    pub fn for_this_machine() -> Self {
        let cpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            cpu,
            parts_in_flight: cpu + 4,
            existing: Existing::Refuse,
            readers: 1,
            writers: 2,
            scheduling: Scheduling::default(),
        }
    }
}
