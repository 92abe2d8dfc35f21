//! The landing zone: with `core` tasks configured, a verified batch is committed into a
//! directory of its own in the landing zone, not the destination; its tasks run there; a batch
//! they all pass is promoted into the destination (each top directory it brings renamed into
//! place whole, so with the default layout the batch appears at once), and one a task refused
//! goes to quarantine, with the reason and each refusing try's output beside it. The relay is
//! acknowledged only after either, both durable: a puller killed before that finds the batch
//! at the relay again, lands it afresh (what a killed run left in its landing directory is
//! cleared first) and runs its tasks again.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use forte_restore::Placed;

use forte_catalog::TaskOutcome;

use super::landed::Landed;
use crate::tasks::{self, Point, Refusal, Subject, SubjectFile, Tasks};

/// Where batches land and are quarantined, and the tasks that decide between promotion and
/// quarantine.
pub struct Landing {
    pub tasks: Tasks,
    root: PathBuf,
    quarantine: PathBuf,
}

/// The file beside a quarantined batch that says why it is there.
pub const REASON_FILE: &str = "forte-reason.txt";
/// The directory beside a quarantined batch with each refusing try's output.
pub const OUTPUT_DIR: &str = "forte-output";

impl Landing {
    /// The landing zone and quarantine (by default hidden directories of `dest`, on its
    /// filesystem, so that promotion is a rename), created now so a bad path fails at start.
    pub fn new(
        tasks: Tasks,
        dest: &Path,
        root: Option<PathBuf>,
        quarantine: Option<PathBuf>,
    ) -> Result<Self> {
        let root = root.unwrap_or_else(|| dest.join(".forte-landing"));
        let quarantine = quarantine.unwrap_or_else(|| dest.join(".forte-quarantine"));
        for dir in [&root, &quarantine] {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        Ok(Self {
            tasks,
            root,
            quarantine,
        })
    }

    /// The landing directory of a batch, emptied of what a killed run left there.
    pub fn clear(&self, site: &str, batch: &str) -> Result<PathBuf> {
        let dir = self.root.join(site).join(batch);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot clear the landing directory {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the landing directory {}", dir.display()))?;
        Ok(dir)
    }

    /// Runs the `at` tasks on the batch's files placed in `dir` (those delivered now: files
    /// found in place passed before); what they refused.
    pub fn check(
        &self,
        at: Point,
        batch: (&forte_catalog::BatchKey, &str, &str),
        dir: &Path,
        placed: &[Placed],
        catalog: &crate::record::Catalog,
    ) -> Vec<Refusal> {
        let run = self.tasks.at(at);
        if run.is_empty() {
            return Vec::new();
        }
        let (key, site, name) = batch;
        let files: Vec<SubjectFile> = placed
            .iter()
            .filter(|p| at == Point::Delivered || !p.already)
            .map(|p| SubjectFile {
                object_id: p.id.to_string(),
                path: p.path.clone(),
                under_dir: p.target.clone(),
                sha256: p.sha256.clone(),
                size: p.size,
            })
            .collect();
        if files.is_empty() {
            return Vec::new();
        }
        // One list per batch, which one worker holds at a time: a killed run's is overwritten.
        let list = self.root.join(format!(".{site}-{}.files", key.batch()));
        let subject = Subject {
            key,
            site,
            batch: name,
            at,
            dir,
            files: &files,
            list,
        };
        if at != Point::Core {
            return tasks::check(&run, &subject, catalog);
        }
        // What is promoted must be what was verified: the batch is read-only while its tasks
        // run, and checked against the verified files after.
        let names: Vec<&str> = run.iter().map(|t| t.name.as_str()).collect();
        let landed_wrong = |outcome, reason: String| Refusal {
            task: names.join(", "),
            file: None,
            outcome,
            reason,
            output: Vec::new(),
        };
        let checking = std::time::Instant::now();
        let landed = match Landed::protect(dir, placed) {
            Ok(landed) => landed,
            Err(e) => {
                let why = format!("cannot make the landed batch read-only for its tasks: {e:#}");
                return vec![landed_wrong(TaskOutcome::Crashed, why)];
            }
        };
        let protected = checking.elapsed();
        let mut refusals = tasks::check(&run, &subject, catalog);
        let after_tasks = std::time::Instant::now();
        let changes = landed.changes(dir);
        tracing::debug!(
            batch = name,
            files = files.len(),
            protect_ms = protected.as_secs_f64() * 1e3,
            check_ms = after_tasks.elapsed().as_secs_f64() * 1e3,
            "landed batch checked"
        );
        match changes {
            Ok(changes) if changes.is_empty() => {}
            Ok(changes) => refusals.push(landed_wrong(TaskOutcome::Changed, summary(&changes))),
            Err(e) => {
                let why = format!("cannot check the landed batch after its tasks: {e:#}");
                refusals.push(landed_wrong(TaskOutcome::Crashed, why));
            }
        }
        if let Err(e) = landed.release(dir) {
            let why = format!("cannot make the landed batch writable again: {e:#}");
            refusals.push(landed_wrong(TaskOutcome::Crashed, why));
        }
        refusals
    }

    /// Moves everything under the landing directory `dir` into `dest`: a directory `dest`
    /// lacks is renamed into place whole, one it has is entered; then makes it durable and
    /// removes the emptied landing directory.
    pub fn promote(&self, dir: &Path, dest: &Path) -> Result<()> {
        move_into(dir, dest)?;
        forte_fs::syncfs(dest)?;
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("cannot remove the landing directory {}", dir.display()))?;
        remove_if_empty(dir.parent());
        Ok(())
    }

    /// Moves the landing directory `dir` of a refused batch to the quarantine (replacing what
    /// an earlier, killed run put there), with `forte-reason.txt` and each refusing try's
    /// output beside its files; returns where it is.
    pub fn quarantine(
        &self,
        dir: &Path,
        (site, batch): (&str, &str),
        refusals: &[Refusal],
    ) -> Result<PathBuf> {
        let kept = self.quarantine.join(site).join(batch);
        if kept.exists() {
            std::fs::remove_dir_all(&kept)
                .with_context(|| format!("cannot replace {}", kept.display()))?;
        }
        let parent = kept.parent().expect("under the quarantine");
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        rename(dir, &kept)?;
        remove_if_empty(dir.parent());
        let reasons: String = refusals.iter().map(|r| format!("{r}\n")).collect();
        write(&kept.join(REASON_FILE), reasons.as_bytes())?;
        let outputs = kept.join(OUTPUT_DIR);
        std::fs::create_dir_all(&outputs)
            .with_context(|| format!("cannot create {}", outputs.display()))?;
        for (i, r) in refusals.iter().enumerate() {
            let name = format!("{}-{}.log", i + 1, r.task);
            write(&outputs.join(name), &r.output)?;
        }
        forte_fs::syncfs(&kept)?;
        Ok(kept)
    }
}

/// The first of `changes` (a task adding 100 000 files gives as many lines), and how many more.
fn summary(changes: &[String]) -> String {
    const SHOWN: usize = 20;
    let mut text = changes[..changes.len().min(SHOWN)].join("; ");
    if changes.len() > SHOWN {
        text.push_str(&format!("; and {} more", changes.len() - SHOWN));
    }
    text
}

/// Moves each entry of `from` into `to`: renamed whole where `to` has nothing of that name,
/// entered where both are directories; a file `to` has already is an error (the destination
/// check before staging let only files through that it lacks).
fn move_into(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    let entries =
        std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read {}", from.display()))?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        match std::fs::symlink_metadata(&target) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => rename(&source, &target)?,
            Ok(meta) if meta.is_dir() && entry.file_type()?.is_dir() => {
                move_into(&source, &target)?
            }
            Ok(_) => bail!(
                "cannot promote {}: {} is in the way",
                source.display(),
                target.display()
            ),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot look at {}", target.display()))
            }
        }
    }
    Ok(())
}

/// Removes a site's landing directory once its last batch left it (another worker may just
/// have created a batch in it: then it is not empty, and stays).
fn remove_if_empty(dir: Option<&Path>) {
    if let Some(dir) = dir {
        let _ = std::fs::remove_dir(dir);
    }
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).with_context(|| {
        format!(
            "cannot move {} to {} (the landing zone, the quarantine and the destination must be on one filesystem)",
            from.display(),
            to.display()
        )
    })
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}
