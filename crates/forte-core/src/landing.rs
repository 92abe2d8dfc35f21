//! The landing zone: with `core` tasks configured, a verified batch is committed into a
//! directory of its own in the landing zone, not the destination; its tasks run there; a batch
//! they all pass is promoted into the destination (each top directory it brings renamed into
//! place whole, so with the default layout the batch appears at once), and one a task refused
//! goes to quarantine, with the reason and each refusing try's output beside it. The relay is
//! acknowledged only after either, both durable: a puller killed before that finds the batch
//! at the relay again, lands it afresh and runs its tasks again.
//!
//! Each pull process keeps what it lands in a part of the landing zone named for it,
//! `pull-HOST-PID` (its batches' landing directories `SITE/BATCH` and their file lists), so that
//! the next start removes whatever a killed or cut-off puller of this machine left there
//! ([`remove_stale`]), even when that batch is delivered without landing again (its tasks taken
//! out of the configuration, or another worker delivered it).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use forte_restore::Placed;

use forte_catalog::TaskOutcome;

use super::destination::WhereItGoes;
use super::landed::Landed;
use forte_daemon::tasks::{self, Point, Refusal, Subject, SubjectFile, Task, Tasks};

/// Where batches land and are quarantined, and the tasks that decide between promotion and
/// quarantine.
pub struct Landing {
    pub tasks: Tasks,
    /// This process's part of the landing zone (created when a batch lands).
    area: PathBuf,
    quarantine: PathBuf,
    /// Where batches are promoted, watched while core tasks run ([`WhereItGoes`]).
    dest: PathBuf,
}

/// A batch as its tasks are told of it: its key, the site it came from, and its name.
#[derive(Debug, Clone, Copy)]
pub struct BatchNamed<'a> {
    pub key: &'a forte_catalog::BatchKey,
    pub site: &'a str,
    /// The batch's name (found in its verified manifests).
    pub name: &'a str,
}

/// The file beside a quarantined batch that says why it is there.
pub const REASON_FILE: &str = "forte-reason.txt";
/// The directory beside a quarantined batch with each refusing try's output.
pub const OUTPUT_DIR: &str = "forte-output";
/// How a pull process's part of the landing zone begins; `HOST-PID` follows.
const AREA_PREFIX: &str = "pull-";

/// The landing zone: `configured` (`--landing`, `pull.landing`), or a hidden directory of
/// `dest`, on its filesystem, so that promotion is a rename.
pub fn root(dest: &Path, configured: Option<PathBuf>) -> PathBuf {
    configured.unwrap_or_else(|| dest.join(".forte-landing"))
}

/// Removes the parts of the landing zone `root` left by pull processes of this machine that
/// are gone (killed, or ended by `--shutdown-grace` while a batch was landing or tasks ran);
/// how many. Other processes' parts (running, or on other machines sharing the zone) stay.
pub fn remove_stale(root: &Path) -> Result<usize> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Ok(0);
    };
    let host = forte_usage::host_name();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((owner, pid)) = name
            .strip_prefix(AREA_PREFIX)
            .and_then(|owner| owner.rsplit_once('-'))
        else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if owner != host || forte_usage::process_alive(pid) {
            continue;
        }
        forte_fs::remove_tree(&entry.path()).with_context(|| {
            format!(
                "cannot remove {}, left in the landing zone by an interrupted pull",
                entry.path().display()
            )
        })?;
        removed += 1;
    }
    Ok(removed)
}

impl Landing {
    /// The landing zone ([`root`]) and quarantine (by default hidden directories of `dest`,
    /// on its filesystem, so that promotion is a rename), created now so a bad path fails at
    /// start.
    pub fn new(
        tasks: Tasks,
        dest: &Path,
        root: Option<PathBuf>,
        quarantine: Option<PathBuf>,
    ) -> Result<Self> {
        let root = self::root(dest, root);
        let quarantine = quarantine.unwrap_or_else(|| dest.join(".forte-quarantine"));
        for dir in [&root, &quarantine] {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        // Promotion and quarantine are renames: on another file system every batch would land,
        // be checked, and then fail.
        if let Ok(on) = std::fs::metadata(dest).map(|m| std::os::unix::fs::MetadataExt::dev(&m)) {
            let settings = [
                (&root, "--landing (pull.landing)", ".forte-landing"),
                (
                    &quarantine,
                    "--quarantine (pull.quarantine)",
                    ".forte-quarantine",
                ),
            ];
            for (dir, setting, default) in settings {
                let there = std::fs::metadata(dir).map(|m| std::os::unix::fs::MetadataExt::dev(&m));
                if there.is_ok_and(|d| d != on) {
                    anyhow::bail!(
                        "{setting} {} is on another file system than the destination {}: batches are moved from there by renaming; give a directory on the destination's file system (the default is {})",
                        dir.display(),
                        dest.display(),
                        dest.join(default).display()
                    );
                }
            }
        }
        let owner = format!("{}-{}", forte_usage::host_name(), std::process::id());
        Ok(Self {
            tasks,
            area: root.join(format!("{AREA_PREFIX}{owner}")),
            quarantine,
            dest: dest.to_path_buf(),
        })
    }

    /// The landing directory of a batch, emptied of what an earlier try of this process left
    /// there.
    pub fn clear(&self, site: &str, batch: &str) -> Result<PathBuf> {
        let dir = self.area.join(site).join(batch);
        if dir.exists() {
            forte_fs::remove_tree(&dir)
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
        batch: BatchNamed<'_>,
        dir: &Path,
        placed: &[Placed],
        catalog: &forte_daemon::record::Catalog,
    ) -> Vec<Refusal> {
        let run = self.tasks.at(at);
        if run.is_empty() {
            return Vec::new();
        }
        let BatchNamed { key, site, name } = batch;
        let files = subject_files(at, placed);
        if files.is_empty() {
            return Vec::new();
        }
        // Outside the batch's directory: the list is not part of the batch.
        let list = self.area.join(format!(".{site}-{}.files", key.batch()));
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
            let refusals = tasks::check(&run, &subject, catalog);
            remove_if_empty(&self.area);
            return refusals;
        }
        self.check_read_only(&run, &subject, placed, catalog)
    }

    /// Runs the core tasks `run` on the landed batch `subject`, read-only. What is promoted
    /// must be what was verified: the batch is read-only while its tasks run, and checked
    /// against the verified files (`placed`) after; a change, or a batch that cannot be
    /// protected or checked, is a refusal.
    fn check_read_only(
        &self,
        run: &[&Task],
        subject: &Subject<'_>,
        placed: &[Placed],
        catalog: &forte_daemon::record::Catalog,
    ) -> Vec<Refusal> {
        let dir = subject.dir;
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
        let destination = WhereItGoes::of(&self.dest, placed);
        let mut refusals = tasks::check(run, subject, catalog);
        let after_tasks = std::time::Instant::now();
        let changes = landed.changes(dir).map(|mut changes| {
            changes.extend(destination.changes(&self.dest));
            changes
        });
        tracing::debug!(
            batch = subject.batch,
            files = subject.files.len(),
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
    /// removes the emptied landing directory. A file in the way is refused, or, with
    /// `replace` (a later version of its batch), kept there and replaced: each such file's
    /// path under `dest` and where it is kept are returned.
    pub fn promote(
        &self,
        dir: &Path,
        dest: &Path,
        replace: Option<&Path>,
    ) -> Result<Vec<(PathBuf, PathBuf)>> {
        let mut replaced = Vec::new();
        move_into(dir, dest, Path::new(""), (replace, &mut replaced))?;
        forte_fs::syncfs(dest)?;
        forte_fs::remove_tree(dir)
            .with_context(|| format!("cannot remove the landing directory {}", dir.display()))?;
        remove_emptied_parents(dir);
        Ok(replaced)
    }

    /// Moves the landing directory `dir` of a refused batch to the quarantine (replacing what
    /// an earlier, killed run put there), with `forte-reason.txt` and each refusing try's
    /// output beside its files; returns where it is.
    pub fn quarantine(
        &self,
        dir: &Path,
        site: &str,
        batch: &str,
        refusals: &[Refusal],
    ) -> Result<PathBuf> {
        let kept = self.quarantine.join(site).join(batch);
        if kept.exists() {
            forte_fs::remove_tree(&kept)
                .with_context(|| format!("cannot replace {}", kept.display()))?;
        }
        let parent = kept.parent().expect("under the quarantine");
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        rename(dir, &kept)?;
        remove_emptied_parents(dir);
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

/// The files of `placed` the `at` tasks are run on: at [`Point::Delivered`] all, else those
/// delivered now (files found in place passed before).
fn subject_files(at: Point, placed: &[Placed]) -> Vec<SubjectFile> {
    placed
        .iter()
        .filter(|p| at == Point::Delivered || !p.already)
        .map(|p| SubjectFile {
            object_id: p.id.to_string(),
            path: p.path.clone(),
            under_dir: p.target.clone(),
            sha256: p.sha256.clone(),
            size: p.size,
        })
        .collect()
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
/// Where earlier versions of files are kept when the batch may replace them, and each file
/// replaced (its path under the destination) with where it is kept.
type Replacing<'a> = (Option<&'a Path>, &'a mut Vec<(PathBuf, PathBuf)>);

/// Moves the entries of `from` into `to`, which is `rel` under the destination.
fn move_into(from: &Path, to: &Path, rel: &Path, replacing: Replacing<'_>) -> Result<()> {
    let (replace, replaced) = replacing;
    std::fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    let entries =
        std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read {}", from.display()))?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let rel = rel.join(entry.file_name());
        let kind = entry.file_type()?;
        match (std::fs::symlink_metadata(&target), replace) {
            (Err(e), _) if e.kind() == std::io::ErrorKind::NotFound => rename(&source, &target)?,
            (Ok(meta), _) if meta.is_dir() && kind.is_dir() => {
                move_into(&source, &target, &rel, (replace, &mut *replaced))?
            }
            (Ok(meta), Some(keep_in)) if meta.is_file() && kind.is_file() => {
                let kept = forte_restore::keep_earlier_version(&target, keep_in, &rel)?;
                rename(&source, &target)?;
                replaced.push((rel, kept));
            }
            (Ok(_), _) => bail!(
                "cannot promote {}: {} is in the way",
                source.display(),
                target.display()
            ),
            (Err(e), _) => {
                return Err(e).with_context(|| format!("cannot look at {}", target.display()))
            }
        }
    }
    Ok(())
}

/// Removes the site's directory and this process's part of the landing zone above the landing
/// directory `dir` that left them, where it was the last thing in them.
fn remove_emptied_parents(dir: &Path) {
    for parent in dir.ancestors().skip(1).take(2) {
        remove_if_empty(parent);
    }
}

/// Removes `dir` if nothing is in it.
fn remove_if_empty(dir: &Path) {
    let _ = std::fs::remove_dir(dir);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the parts of gone processes of this machine are removed: a live process's part,
    /// another machine's and anything else in the zone (an older layout's site) stay.
    #[test]
    fn only_what_gone_pulls_of_this_machine_left_is_stale() {
        let root = tempfile::tempdir().unwrap();
        let host = forte_usage::host_name();
        let names = [
            format!("{AREA_PREFIX}{host}-{}", std::process::id()),
            format!("{AREA_PREFIX}{host}-4000000"),
            format!("{AREA_PREFIX}other-host-4000000"),
            "site-a".to_string(),
        ];
        for name in &names {
            std::fs::create_dir_all(root.path().join(name).join("s/b")).unwrap();
        }
        assert_eq!(remove_stale(root.path()).unwrap(), 1);
        let mut left: Vec<String> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut kept = vec![names[0].clone(), names[2].clone(), names[3].clone()];
        kept.sort();
        assert_eq!(left, kept);
    }
}
