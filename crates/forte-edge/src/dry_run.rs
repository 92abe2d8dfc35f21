//! `send --dry-run` and `pack --dry-run`: the files a send or a pack would take, after the
//! filter, and those it would leave out and why; for send, what the edge's catalogue says was
//! sent and acknowledged before, and with `--delete-after-ack` the sources that would be
//! deleted under the core's receipts. Reads the inbox or the tree, the catalogue opened
//! read-only (`Catalog::open_read_only`: nothing created, locked or written, not even its
//! `-wal` or `-shm`) and, for deletions, asks the relay read-only questions (its name for the
//! token, the batch's receipts). No lock, no upload, nothing recorded or deleted.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use forte_catalog::{BatchRow, BatchState, Catalog, FileRow, FileState, Role};
use forte_daemon::settings::{Config, EdgeSite, SendCommand};
use forte_format::{EdgeKey, Kind, ObjectId, Receipt, ReceiptFile, TrustedCores};
use forte_prepare::{discover, Excluded, Filter, SourceFile};
use forte_relay::client::RelayClient;
use serde::Serialize;

use crate::inbox::{ready_batches, READY_MARKER};
use crate::object_id;

/// What a send would do with a file.
#[derive(Debug, Serialize, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum FileAction {
    /// Not sent before (or changed since): it would be prepared and uploaded.
    #[default]
    WouldSend,
    /// Uploaded before, its batch not sealed: sealed without uploading it again.
    Uploaded,
    /// Sent and sealed before; the core has not acknowledged it (as far as the catalogue knows).
    Sent,
    /// Sent before and acknowledged by the core.
    Acknowledged,
    /// Its batch is held back (cancelled, or refused by an edge task): nothing of it is sent.
    HeldBack,
}

impl FileAction {
    fn text(self) -> &'static str {
        match self {
            Self::WouldSend => "would send",
            Self::Uploaded => "uploaded before, would seal",
            Self::Sent => "sent before",
            Self::Acknowledged => "acknowledged",
            Self::HeldBack => "held back",
        }
    }
}

/// A file that would be sent or packed.
#[derive(Debug, Serialize)]
pub struct PlannedFile {
    /// Relative to the inbox for send (`batch/sub/file`), to the packed tree for pack.
    pub path: String,
    pub size: u64,
    /// What a send would do with it (pack: always `would_send`).
    pub action: FileAction,
    /// The file as found, to know it by its object id.
    #[serde(skip)]
    source: Option<SourceFile>,
}

/// What a pass over the tree would take.
#[derive(Debug, Serialize, Default)]
pub struct Plan {
    pub files: Vec<PlannedFile>,
    pub excluded: Vec<Excluded>,
    /// Entries never taken whatever the filter says (symbolic links, names not UTF-8).
    pub refused: Vec<String>,
}

/// What a send would do with a ready batch, by what the catalogue says of it.
#[derive(Debug, Serialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BatchAction {
    /// Never sent: every file it takes.
    Send,
    /// Sent before: only the files new or changed since, as a follow-up (none: nothing).
    FollowUp,
    /// Its last send did not finish (failed, or killed): sent again, what the relay holds
    /// already skipped.
    SendAgain,
    /// Cancelled or refused, its ready marker not touched since: skipped.
    HeldBack,
}

/// One ready batch of the inbox, as a send would take it.
#[derive(Debug, Serialize)]
pub struct PlannedBatch {
    pub batch: String,
    pub action: BatchAction,
    /// Its state in the edge's catalogue, if it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<String>,
    #[serde(flatten)]
    pub plan: Plan,
}

/// What `send` would take from the inbox: each ready batch, the batches not ready yet, and
/// with `--delete-after-ack` what would be deleted.
#[derive(Debug, Serialize)]
pub struct SendPlan {
    pub batches: Vec<PlannedBatch>,
    pub waiting: Vec<String>,
    /// The catalogue read, or why none was (`None`: not there, nothing was sent before).
    pub catalogue: Option<String>,
    /// Notes on what the plan could not know.
    pub notes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deletions: Option<Vec<PlannedDeletion>>,
}

/// What the edge's catalogue, opened read-only, says of earlier sends.
pub struct History<'a> {
    /// `None`: no catalogue (nothing was sent before).
    pub catalog: Option<&'a Catalog>,
    /// This edge's signing key: a file is known by its object id (path, size, mtime), as a
    /// real send knows it; without it, by its path and size.
    pub key: Option<&'a EdgeKey>,
}

/// What `--delete-after-ack` needs to say what it would delete: the relay, asked read-only
/// questions, and the core's receipt keys.
pub struct ReceiptCheck<'a> {
    pub client: &'a RelayClient,
    pub trusted: &'a TrustedCores,
    pub site: &'a EdgeSite,
    pub key: &'a EdgeKey,
}

/// Every ready batch of `inbox` (ready as `send` judges it: a marker, or `settle` quiet) with
/// the files a send would take, forte's own marker never among them, each marked by what the
/// catalogue (`history`) says was sent before.
pub fn send_plan(
    inbox: &Path,
    settle: Duration,
    filter: &Filter,
    history: &History,
) -> Result<SendPlan> {
    let found = ready_batches(inbox, settle)?;
    let mut notes = Vec::new();
    if history.catalog.is_some() && history.key.is_none() {
        notes.push("no signing key (--sign or keys.sign): files are known by path and size, not by object id; a file rewritten with its size kept is listed as sent".into());
    }
    let rows = match history.catalog {
        Some(c) => edge_batches(c)?,
        None => HashMap::new(),
    };
    let mut batches = Vec::new();
    for batch in found.ready {
        let mut plan = plan(&batch.dir, &batch.name, filter)?;
        let row = rows.get(&batch.name);
        let action = batch_action(row, &batch.dir);
        if let (Some(catalog), Some(row)) = (history.catalog, row) {
            let files = catalog
                .files(&row.batch_key)
                .with_context(|| format!("reading batch {} in the catalogue", batch.name))?;
            mark_files(&mut plan, &files, &batch.name, history.key);
        }
        if action == BatchAction::HeldBack {
            plan.files
                .iter_mut()
                .for_each(|f| f.action = FileAction::HeldBack);
        }
        batches.push(PlannedBatch {
            batch: batch.name,
            action,
            recorded: row.map(|r| r.state.as_str().to_string()),
            plan,
        });
    }
    Ok(SendPlan {
        batches,
        waiting: found.waiting,
        catalogue: history.catalog.map(|c| c.url().to_string()),
        notes,
        deletions: None,
    })
}

/// `send --dry-run`: the plan of a send with these flags, by the inbox and the catalogue
/// (`catalog`, opened read-only; `None` when there is none); with `--delete-after-ack`, the
/// send's settings resolved as a send resolves them (the same errors) and the relay asked
/// read-only what receipts it holds.
pub fn send(flags: SendCommand, config: &Config, catalog: Option<&Catalog>) -> Result<SendPlan> {
    let filter = flags.edge.filter(config)?;
    let key = flags.edge.signing_key(config)?;
    let history = History {
        catalog,
        key: key.as_ref(),
    };
    let mut plan = send_plan(flags.inbox, flags.send.settle(), &filter, &history)?;
    if !flags.send.has_site() {
        plan.notes.push("no site (--site NAME, or site in [send]): send would refuse to start, since it never takes its site from the relay".into());
    }
    if flags.send.delete_after_ack() {
        let inbox = flags.inbox;
        let settings = forte_daemon::settings::send(flags, config)?;
        let trusted =
            (settings.receipts.as_ref()).context("--delete-after-ack needs --receipt-pub")?;
        plan.deletions = Some(match catalog {
            Some(catalog) => {
                let client = settings.relay.connect()?;
                let check = ReceiptCheck {
                    client: &client,
                    trusted,
                    site: &settings.site,
                    key: &settings.edge.key,
                };
                deletion_plan(inbox, catalog, &filter, &check)?
            }
            None => Vec::new(),
        });
    }
    Ok(plan)
}

/// The edge's batches in the catalogue by name: the latest row of each (a batch sent under an
/// earlier signing key has a row of its own).
fn edge_batches(catalog: &Catalog) -> Result<HashMap<String, BatchRow>> {
    let mut rows = HashMap::new();
    for row in catalog
        .batches()
        .context("reading the catalogue's batches")?
    {
        if row.role == Role::Edge {
            // Ordered by creation: the later row wins.
            rows.insert(row.name.clone(), row);
        }
    }
    Ok(rows)
}

/// What a send does with a ready batch in state `row` (as `Edge::needs_sending` and
/// `held_back` judge it).
fn batch_action(row: Option<&BatchRow>, dir: &Path) -> BatchAction {
    let Some(row) = row else {
        return BatchAction::Send;
    };
    match row.state {
        BatchState::Sent | BatchState::SourceKept | BatchState::SourceDeleted => {
            BatchAction::FollowUp
        }
        BatchState::Cancelled | BatchState::Refused
            if crate::inbox::marker_time_us(dir).is_none_or(|t| t <= row.updated_at) =>
        {
            BatchAction::HeldBack
        }
        _ => BatchAction::SendAgain,
    }
}

/// Marks each file of `plan` by the catalogue's row of it (`files`): by its object id when the
/// key is known, else by path and size.
fn mark_files(plan: &mut Plan, files: &[FileRow], batch: &str, key: Option<&EdgeKey>) {
    let by_id: HashMap<&str, FileState> = files
        .iter()
        .map(|r| (r.object_id.as_str(), r.state))
        .collect();
    let by_path: HashMap<(&str, u64), FileState> = files
        .iter()
        .map(|r| ((r.path.as_str(), r.size as u64), r.state))
        .collect();
    for f in &mut plan.files {
        let Some(source) = &f.source else { continue };
        let state = match key {
            Some(key) => by_id
                .get(object_id(key, batch, source).to_string().as_str())
                .copied(),
            None => by_path.get(&(source.path.as_str(), source.size)).copied(),
        };
        f.action = match state {
            Some(FileState::Acknowledged) => FileAction::Acknowledged,
            Some(FileState::Sealed | FileState::Verified | FileState::Delivered) => {
                FileAction::Sent
            }
            Some(FileState::AtRelay) => FileAction::Uploaded,
            _ => FileAction::WouldSend,
        };
    }
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
            .filter(|f| f.kind == Kind::File)
            .map(|f| PlannedFile {
                path: at(&f.path),
                size: f.size,
                action: FileAction::WouldSend,
                source: Some(f.clone()),
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

/// A sent batch as `--delete-after-ack` would leave it.
#[derive(Debug, Serialize)]
pub struct PlannedDeletion {
    pub batch: String,
    /// Receipts of the core the relay holds for it that verify and name this site.
    pub receipts: usize,
    /// Sources a receipt lists with the bytes they still have: deleted.
    pub delete: Vec<String>,
    /// Sources kept, with why (changed since sent, excluded by the filter, receipts refused).
    pub kept: Vec<String>,
    /// Sources no receipt lists yet: kept until one does.
    pub waiting: usize,
}

/// What `--delete-after-ack` would delete now: in every batch the catalogue records as sent
/// (as `Edge::delete_acknowledged` goes through them), each source file a verified receipt
/// of the core lists with the SHA-256 its bytes still have. Asks the relay its name for the
/// token (checked against this edge's site) and each batch's receipts, read-only; deletes and
/// records nothing.
pub fn deletion_plan(
    inbox: &Path,
    catalog: &Catalog,
    filter: &Filter,
    check: &ReceiptCheck,
) -> Result<Vec<PlannedDeletion>> {
    let site = check.site.get(check.client)?;
    let mut planned = Vec::new();
    for b in catalog
        .batches()
        .context("reading the catalogue's batches")?
    {
        if b.role != Role::Edge || b.state != BatchState::Sent {
            continue;
        }
        let Ok(found) = discover(&inbox.join(&b.name)) else {
            continue;
        };
        let documents = check
            .client
            .receipts(b.batch_key.batch())
            .with_context(|| format!("asking the relay for batch {}'s receipts", b.name))?;
        let mut d = PlannedDeletion {
            batch: b.name.clone(),
            receipts: 0,
            delete: Vec::new(),
            kept: Vec::new(),
            waiting: 0,
        };
        let mut listed: HashMap<ObjectId, ReceiptFile> = HashMap::new();
        for document in documents {
            match Receipt::open(&document, check.trusted) {
                Ok(r) if r.site == site => {
                    d.receipts += 1;
                    listed.extend(r.files.into_iter().map(|f| (f.id, f)));
                }
                Ok(r) => d.kept.push(format!("a receipt of site {} ignored", r.site)),
                Err(e) => d
                    .kept
                    .push(format!("a receipt that does not verify ({e}) ignored")),
            }
        }
        let files = found.files.iter().filter(|f| f.path != READY_MARKER);
        let now = SystemTime::now();
        for f in files {
            let at = format!("{}/{}", b.name, f.path);
            // As deletion does: what the filter leaves out now stays, receipt or not.
            if let Some(why) = filter.excludes_file(f, &b.name, now) {
                d.kept.push(format!("{at}: {why}"));
                continue;
            }
            match listed.get(&object_id(check.key, &b.name, f)) {
                Some(l) if as_listed(f, l) => d.delete.push(at),
                Some(_) => d.kept.push(format!("{at}: changed after it was sent")),
                None => d.waiting += 1,
            }
        }
        planned.push(d);
    }
    Ok(planned)
}

/// Whether `f` still is what the receipt lists (a directory: always; a file: its size and
/// SHA-256, read through a read-only descriptor), as `remove_if_as_delivered` checks it.
fn as_listed(f: &SourceFile, listed: &ReceiptFile) -> bool {
    if f.kind == Kind::Dir {
        return true;
    }
    let Ok(mut file) = std::fs::File::open(&f.local) else {
        return false;
    };
    let same_size = file
        .metadata()
        .is_ok_and(|m| m.is_file() && m.len() == listed.size);
    same_size && forte_format::seal::sha256_of(&mut file).is_ok_and(|h| h == listed.sha256)
}

impl Plan {
    /// The plan as lines for people: each file, then what is left out and why.
    pub fn text(&self, indent: &str) -> String {
        let mut out = String::new();
        for f in &self.files {
            out += &format!(
                "{indent}{} {} ({} bytes)\n",
                f.action.text(),
                f.path,
                f.size
            );
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

impl PlannedBatch {
    /// Its first line: what a send would do with it.
    fn headline(&self) -> String {
        let count = |a: FileAction| self.plan.files.iter().filter(|f| f.action == a).count();
        let new: Vec<&PlannedFile> = (self.plan.files.iter())
            .filter(|f| f.action == FileAction::WouldSend)
            .collect();
        let bytes: u64 = new.iter().map(|f| f.size).sum();
        let excluded = self.plan.excluded.len();
        let recorded = self.recorded.as_deref().unwrap_or("");
        let before = format!(
            "{} sent before ({} acknowledged)",
            count(FileAction::Sent) + count(FileAction::Acknowledged),
            count(FileAction::Acknowledged)
        );
        match self.action {
            BatchAction::Send => format!(
                "would send {} files ({bytes} bytes), {excluded} excluded",
                new.len()
            ),
            BatchAction::FollowUp if new.is_empty() => {
                format!("sent before ({recorded}): nothing new to send; {before}, {excluded} excluded")
            }
            BatchAction::FollowUp => format!(
                "sent before ({recorded}): would send {} new or changed files ({bytes} bytes) as a follow-up; {before}, {excluded} excluded",
                new.len()
            ),
            BatchAction::SendAgain => format!(
                "its last send did not finish ({recorded}): would send {} files ({bytes} bytes) again, {} uploaded before; {excluded} excluded",
                new.len(),
                count(FileAction::Uploaded) + count(FileAction::Sent)
            ),
            BatchAction::HeldBack => format!(
                "{recorded}: would not be sent until its {READY_MARKER} marker is touched"
            ),
        }
    }
}

impl SendPlan {
    /// The plan as text: per batch what a send would do and its files, what is left out, the
    /// batches not ready, then what `--delete-after-ack` would delete.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for b in &self.batches {
            out += &format!("batch {}: {}\n", b.batch, b.headline());
            out += &b.plan.text("  ");
        }
        for name in &self.waiting {
            out += &format!("batch {name}: not ready yet, would not be sent\n");
        }
        for d in self.deletions.iter().flatten() {
            out += &format!(
                "batch {}: would delete {} source files under {} receipt(s) of the core; {} kept, {} waiting for a receipt\n",
                d.batch,
                d.delete.len(),
                d.receipts,
                d.kept.len(),
                d.waiting
            );
            d.delete
                .iter()
                .for_each(|p| out += &format!("  would delete {p}\n"));
            d.kept
                .iter()
                .for_each(|k| out += &format!("  would keep   {k}\n"));
        }
        match &self.catalogue {
            Some(c) => out += &format!("catalogue {c} read, not written\n"),
            None => out += "no catalogue: nothing was sent before\n",
        }
        self.notes
            .iter()
            .for_each(|n| out += &format!("note: {n}\n"));
        out += "dry run: nothing was sent, recorded or deleted\n";
        out
    }
}
