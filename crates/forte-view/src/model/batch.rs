//! A batch as the API shows it: its row, how far it has come on its node, its rate and ETA.

use anyhow::Result;
use forte_catalog::{BatchRow, BatchState, Catalog, FileState, Role, Stage, StageRow};
use serde::Serialize;

use super::{Phase, Progress};

/// A batch as the API shows it: its row, how far it has come, its rate and ETA.
#[derive(Debug, Clone, Serialize)]
pub struct Batch {
    pub key: String,
    pub role: Role,
    pub site: String,
    pub name: String,
    pub state: BatchState,
    pub files: i64,
    pub bytes: i64,
    pub done_bytes: i64,
    pub progress: f64,
    pub arrived_us: i64,
    pub started_us: Option<i64>,
    pub ended_us: Option<i64>,
    pub updated_us: i64,
    pub rate_bytes_per_second: Option<f64>,
    pub eta_s: Option<f64>,
    pub running: bool,
    pub error: Option<String>,
    /// Where the batch is on its way: this row's alone, or, in the overview, what every
    /// catalogue read knows of it ([`Phase`]).
    pub phase: Phase,
    /// The edge holds a receipt signed by the core for it, verified with a trusted key (the
    /// overview's rows only).
    pub receipted: bool,
    /// Which of the catalogues read holds this row (their order in `GET /api/v1`): two edges'
    /// catalogues may hold a batch of one id, and a link to it names which.
    pub catalog: usize,
}

/// The states of a batch being worked on (or waiting for it) on its node.
pub const RUNNING: [BatchState; 4] = [
    BatchState::Queued,
    BatchState::Sending,
    BatchState::Pulling,
    BatchState::Checking,
];

/// Whether a batch in `state` is being worked on (or waits for it) on its node.
pub fn running(state: BatchState) -> bool {
    RUNNING.contains(&state)
}

/// Whether a batch in `state` ended with all its work done on its node (a quarantined batch's
/// bytes all came; a task held it back).
pub(super) fn finished(state: BatchState) -> bool {
    matches!(
        state,
        BatchState::Sent
            | BatchState::Delivered
            | BatchState::Quarantined
            | BatchState::SourceDeleted
    )
}

/// Raw bytes of a batch's files that are done on its node. At the edge: files at the relay or
/// further, and of the others the parts uploaded (each the size its file was cut at, recorded
/// with the part, else `part_size`; a file's last one smaller). At the core (whose batch `bytes` are the sealed bytes on the wire): the share of
/// the files' raw bytes verified or further.
fn done_bytes(catalog: &Catalog, row: &BatchRow, part_size: u64) -> Result<i64> {
    if finished(row.state) {
        return Ok(row.bytes);
    }
    let files = catalog.progress(&row.batch_key)?;
    let past = |state: FileState, first: FileState| {
        let order = [
            FileState::Discovered,
            FileState::AtRelay,
            FileState::Sealed,
            FileState::Verified,
            FileState::Delivered,
            FileState::Acknowledged,
        ];
        let rank = |s| order.iter().position(|o| *o == s);
        matches!((rank(state), rank(first)), (Some(s), Some(f)) if s >= f)
    };
    Ok(match row.role {
        Role::Edge => files
            .iter()
            .map(|f| {
                if past(f.state, FileState::AtRelay) {
                    f.size
                } else {
                    let cut_at = f.part_size.unwrap_or(part_size as i64);
                    f.size.min(f.parts_done.saturating_mul(cut_at))
                }
            })
            .sum(),
        Role::Core => {
            let all: i64 = files.iter().map(|f| f.size).sum();
            let verified: i64 = files
                .iter()
                .filter(|f| past(f.state, FileState::Verified))
                .map(|f| f.size)
                .sum();
            if all > 0 {
                (row.bytes as f64 * verified as f64 / all as f64) as i64
            } else {
                0
            }
        }
    })
}

/// The stage a batch's row times on its node.
fn own_stage(role: Role) -> Stage {
    match role {
        Role::Edge => Stage::Send,
        Role::Core => Stage::Pull,
    }
}

impl Batch {
    /// `row` with its progress at `now` (µs), reading its stages and files.
    pub fn of(catalog: &Catalog, row: BatchRow, progress: &Progress, now: i64) -> Result<Self> {
        let stages = catalog.stages(&row.batch_key)?;
        Self::with_stages(catalog, row, &stages, progress, now)
    }

    pub(super) fn with_stages(
        catalog: &Catalog,
        row: BatchRow,
        stages: &[StageRow],
        progress: &Progress,
        now: i64,
    ) -> Result<Self> {
        let stage = stages.iter().find(|s| s.stage == own_stage(row.role));
        let started_us = stage.map(|s| s.started_at);
        let ended_us = stage.and_then(|s| s.ended_at);
        let done = done_bytes(catalog, &row, progress.part_size)?.clamp(0, row.bytes.max(0));
        let running = running(row.state);
        let share = if row.bytes > 0 {
            done as f64 / row.bytes as f64
        } else if finished(row.state) {
            1.0
        } else {
            0.0
        };
        // Over the stage; for a running batch, over its last moments where known.
        let mean = started_us
            .map(|start| (ended_us.unwrap_or(now) - start) as f64 / 1e6)
            .filter(|seconds| *seconds > 0.0 && done > 0)
            .map(|seconds| done as f64 / seconds);
        let key = row.batch_key.to_string();
        let rate = if running {
            progress.windowed_rate(&key, now, done).or(mean)
        } else {
            mean
        };
        let eta_s = if running {
            progress.recent_eta(&key, now).or_else(|| {
                rate.filter(|_| row.bytes > 0)
                    .map(|rate| (row.bytes - done) as f64 / rate)
            })
        } else {
            None
        };
        let held_back = [
            BatchState::Failed,
            BatchState::Quarantined,
            BatchState::SourceKept,
        ];
        let error = if running || held_back.contains(&row.state) {
            let last = catalog
                .failures(Some(&row.batch_key), 1)?
                .into_iter()
                .next();
            // A running batch's old failure (a retry that then worked) is history, not news.
            last.filter(|f| !running || started_us.is_some_and(|s| f.at >= s))
                .map(|f| f.error)
        } else {
            None
        };
        Ok(Self {
            key,
            role: row.role,
            site: row.site,
            name: row.name,
            state: row.state,
            files: row.files,
            bytes: row.bytes,
            done_bytes: done,
            progress: share,
            // At the core a batch is first recorded once its pull is under way, which may
            // be after its fetch ahead began: it arrived no later than that.
            arrived_us: started_us.map_or(row.created_at, |s| s.min(row.created_at)),
            started_us,
            ended_us,
            updated_us: row.updated_at,
            rate_bytes_per_second: rate,
            eta_s,
            running,
            error,
            phase: Phase::of_row(row.role, row.state, false),
            receipted: false,
            catalog: 0,
        })
    }
}
