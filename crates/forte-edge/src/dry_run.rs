//! `send --dry-run` and `pack --dry-run`: the files a send or a pack would take, after the
//! filter, and those it would leave out and why. Reads the inbox or the tree, nothing else:
//! no lock, no relay, no catalogue, nothing written.

use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use forte_prepare::{discover, Excluded, Filter};
use serde::Serialize;

use crate::inbox::{ready_batches, READY_MARKER};

/// A file that would be sent or packed.
#[derive(Debug, Serialize)]
pub struct PlannedFile {
    /// Relative to the inbox for send (`batch/sub/file`), to the packed tree for pack.
    pub path: String,
    pub size: u64,
}

/// What a pass over the tree would take.
#[derive(Debug, Serialize, Default)]
pub struct Plan {
    pub files: Vec<PlannedFile>,
    pub excluded: Vec<Excluded>,
    /// Entries never taken whatever the filter says (symbolic links, names not UTF-8).
    pub refused: Vec<String>,
}

/// One ready batch of the inbox, as a send would take it.
#[derive(Debug, Serialize)]
pub struct PlannedBatch {
    pub batch: String,
    #[serde(flatten)]
    pub plan: Plan,
}

/// What `send` would take from the inbox: each ready batch, and the batches not ready yet.
#[derive(Debug, Serialize)]
pub struct SendPlan {
    pub batches: Vec<PlannedBatch>,
    pub waiting: Vec<String>,
}

/// Every ready batch of `inbox` (ready as `send` judges it: a marker, or `settle` quiet) with
/// the files a send would take, forte's own marker never among them.
pub fn send_plan(inbox: &Path, settle: Duration, filter: &Filter) -> Result<SendPlan> {
    let found = ready_batches(inbox, settle)?;
    let mut batches = Vec::new();
    for batch in found.ready {
        let plan = plan(&batch.dir, &batch.name, filter)?;
        batches.push(PlannedBatch {
            batch: batch.name,
            plan,
        });
    }
    Ok(SendPlan {
        batches,
        waiting: found.waiting,
    })
}

/// The files of `root` a pass would take, their paths seen by the filter as `prefix/path`.
pub fn plan(root: &Path, prefix: &str, filter: &Filter) -> Result<Plan> {
    let mut found = discover(root)?;
    if !prefix.is_empty() {
        found.files.retain(|f| f.path != READY_MARKER);
    }
    let excluded = filter.apply(&mut found, prefix, SystemTime::now());
    let at = |path: &str| match prefix {
        "" => path.to_string(),
        _ => format!("{prefix}/{path}"),
    };
    Ok(Plan {
        files: found
            .files
            .iter()
            .filter(|f| f.kind == forte_format::Kind::File)
            .map(|f| PlannedFile {
                path: at(&f.path),
                size: f.size,
            })
            .collect(),
        excluded,
        refused: found
            .rejected
            .iter()
            .map(|(p, why)| format!("{}: {why}", p.display()))
            .collect(),
    })
}

impl Plan {
    /// The plan as lines for people: each file, then what is left out and why.
    pub fn text(&self, indent: &str) -> String {
        let mut out = String::new();
        for f in &self.files {
            out += &format!("{indent}would send {} ({} bytes)\n", f.path, f.size);
        }
        for x in &self.excluded {
            out += &format!("{indent}excluded   {} ({})\n", x.path, x.reason);
        }
        for r in &self.refused {
            out += &format!("{indent}refused    {r}\n");
        }
        out
    }
}

impl SendPlan {
    /// The plan as text: per batch its files, what is left out, then the batches not ready.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for b in &self.batches {
            let bytes: u64 = b.plan.files.iter().map(|f| f.size).sum();
            out += &format!(
                "batch {}: would send {} files ({bytes} bytes), {} excluded\n",
                b.batch,
                b.plan.files.len(),
                b.plan.excluded.len()
            );
            out += &b.plan.text("  ");
        }
        for name in &self.waiting {
            out += &format!("batch {name}: not ready yet, would not be sent\n");
        }
        out += "dry run: nothing was sent, recorded or deleted\n";
        out
    }
}
