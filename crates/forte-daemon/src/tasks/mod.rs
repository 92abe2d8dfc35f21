//! A site's own tasks (`[[task]]` in the configuration file): commands that check, convert or
//! register a batch, or each of its files, at a set point of its way. At the edge a ready
//! batch's `edge` tasks run before it is prepared, and one they refuse is not sent
//! (`crate::edge`). At the core a batch is verified, then lands in a landing zone, where its
//! `core` tasks run; only a batch whose every task passed is promoted to the destination, where
//! engineers see it, and one a task refused goes to quarantine with the task's output
//! (`crate::delivery`). `delivered` tasks run on the batch in the destination.
//!
//! A try passes with exit status 0. Exit status 1 refuses the data: the check will not change
//! its mind, so it is not tried again. Anything else (another status, a signal, its timeout,
//! which kills all its processes) is the task failing, not the data: it is tried again
//! up to `retries` times, and refuses the batch after the last. A command that cannot start
//! fails at once, naming the task and its command. Every try is recorded (`task_runs`), with
//! how long it waited for one of the task's `concurrency` slots and how long it ran.
//!
//! What a task is told, in its environment (and run in `workdir`, by default the
//! configuration file's directory):
//!
//! | variable | value |
//! |---|---|
//! | `FORTE_TASK` | the task's name |
//! | `FORTE_AT` | `edge`, `core` or `delivered` |
//! | `FORTE_SITE` | the edge site that sent the batch (empty at the edge) |
//! | `FORTE_BATCH` | the batch's name |
//! | `FORTE_BATCH_DIR` | where the batch's files are now (every path here is absolute): its inbox directory at the edge, its landing directory for `core`, the destination for `delivered` |
//! | `FORTE_FILES` | a file listing the batch's files: each one's absolute path ended by a NUL byte (`xargs -0 < "$FORTE_FILES"`) |
//! | `FORTE_FILE` | per file: the file's full path |
//! | `FORTE_PATH` | per file: its path in the batch, as the edge had it |
//! | `FORTE_SHA256` | per file: its SHA-256, verified at the core (empty at the edge, where it is not known yet) |
//! | `FORTE_SIZE` | per file: its size in bytes |
//! | `FORTE_TRY` | 1 for the first try, 2 for the first retry, … |

mod run;
mod supervise;

use std::path::PathBuf;
use std::time::Duration;

pub use run::{check, Refusal, Subject, SubjectFile};
pub use supervise::Supervision;

/// Where on a batch's way a task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Point {
    /// At the edge, the batch ready in the inbox, before it is prepared: what refuses it is
    /// not sent, and stays until its ready marker is touched.
    Edge,
    /// At the core, the batch verified and in the landing zone: what refuses it keeps it
    /// from the destination.
    Core,
    /// At the core, the batch in the destination: a failure is reported, the batch stays.
    Delivered,
}

impl Point {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Edge => "edge",
            Self::Core => "core",
            Self::Delivered => "delivered",
        }
    }
}

/// Whether a task runs once per file of a batch or once per batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Per {
    #[default]
    File,
    Batch,
}

/// One task, resolved from its `[[task]]` entry.
#[derive(Debug, Clone)]
pub struct Task {
    pub name: String,
    pub at: Point,
    pub per: Per,
    /// The program and its arguments (a command line written as one string runs with `sh -c`).
    pub argv: Vec<String>,
    pub workdir: PathBuf,
    pub timeout: Duration,
    /// Tries after the first, for a try that crashed or timed out.
    pub retries: u32,
    /// Tries of this task running at once.
    pub concurrency: usize,
}

/// The site's tasks, in the order the configuration file lists them: at each point they run
/// in that order, and a task runs only once those before it passed.
#[derive(Debug, Clone, Default)]
pub struct Tasks(pub Vec<Task>);

impl Tasks {
    /// The tasks that run at `point`, in order.
    pub fn at(&self, point: Point) -> Vec<&Task> {
        self.0.iter().filter(|t| t.at == point).collect()
    }
}
