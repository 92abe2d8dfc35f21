//! `forte pull`: whole batches from the relay, verified and delivered all or nothing, then
//! acknowledged so the relay may delete them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;
use forte_format::ObjectId;
use forte_relay::api::ReadyObject;
use forte_relay::client::RelayClient;
use forte_restore::{
    new_staging, remove_stale_staging, replicate, Existing, Restore, RestoreFailure, Staged,
};
use serde::Serialize;

use super::unpack::OpenArgs;
use super::{mb_per_s, Daemon, Output};
use crate::config::Config;
use crate::hook::Failures;
use crate::layout::{Fields, Layout};
use crate::record::{note, Catalog};
use crate::schedule::{ScheduleArgs, Waiting};
use crate::transfer::download::RelaySource;
use crate::transfer::retry::Retry;
use crate::transfer::{connect, RelayArgs};
use crate::units::human;
use forte_catalog::FileState::{Acknowledged, Delivered};
use forte_catalog::{
    now_us, BatchKey, BatchRecord, BatchState, FileRecord, FileState, PartHashes, PartState, Role,
    Stage,
};

#[derive(clap::Args)]
pub struct Args {
    /// Destination directory.
    #[arg(long, value_name = "DEST")]
    to: PathBuf,
    #[command(flatten)]
    relay: RelayArgs,
    #[command(flatten)]
    open: OpenArgs,
    /// Where files go under DEST: fields {site} {batch} {path} {yyyy} {mm} {dd} {hh} {date}.
    #[arg(long, default_value = "{site}/{batch}/{path}")]
    layout: String,
    /// A second destination (analysts' copy): every delivered file is copied there too,
    /// atomically, before the relay is told it may delete.
    #[arg(long, value_name = "DIR")]
    copy_to: Option<PathBuf>,
    /// Concurrent downloads from the relay.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    #[command(flatten)]
    schedule: ScheduleArgs,
    #[command(flatten)]
    daemon: Daemon,
    #[command(flatten)]
    output: Output,
}

/// What happened to one batch.
#[derive(Debug, Serialize)]
pub struct BatchReport {
    pub site: String,
    pub batch: String,
    pub objects: usize,
    pub delivered_files: usize,
    /// Already in place from an earlier pull whose acknowledgement was lost.
    pub already_delivered: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub error: Option<String>,
    /// Parts found damaged at the relay and reported to it.
    pub rejected_parts: Vec<String>,
}

pub fn run(args: Args, config: &Config, catalog: &Catalog) -> Result<bool> {
    let layout = Layout::parse(&args.layout)?;
    let endpoint = args.relay.endpoint(config)?;
    let _usage = crate::record::sample_usage(catalog, Role::Core);
    let client = connect(&endpoint, &args.relay)?;
    let (identities, trusted, mut settings) = args.open.load(config)?;
    settings.existing = Existing::KeepIdentical;
    settings.readers = args.connections.max(1);
    // One puller per destination: whatever a killed one left half-staged is garbage.
    let stale = remove_stale_staging(&args.to)?;
    if stale > 0 {
        eprintln!("removed {stale} staging directories left by an interrupted pull");
    }
    let retry = if args.daemon.watch {
        Retry::forever()
    } else {
        Retry::one_shot()
    };
    let core = Core {
        client: &client,
        retry,
        layout: &layout,
        dest: &args.to,
        copy_to: args.copy_to.as_deref(),
        catalog,
        ahead: Mutex::default(),
    };
    let failures = Failures {
        role: Role::Core,
        command: args.daemon.on_failure.clone(),
    };
    let policy = args.schedule.policy(&config.schedule)?;
    // The ready batches in the order the policy serves them now. The relay knows batches only
    // by opaque ids, so name rules of the priority policy cannot apply here.
    let listing = |open: bool| -> Result<Vec<Vec<ReadyObject>>> {
        let ready = retry.run("listing of ready objects", || client.ready(open))?;
        let (now, epoch) = (Instant::now(), now_us() / 1_000_000);
        let waiting = group_by_batch(ready)
            .into_iter()
            .map(|objects| {
                let sealed_at = objects.iter().map(|o| o.sealed_at).max().unwrap_or(0);
                let age = Duration::from_secs((epoch as u64).saturating_sub(sealed_at));
                let waiting = Waiting {
                    arrived: now.checked_sub(age).unwrap_or(now),
                    remaining: objects
                        .iter()
                        .flat_map(|o| &o.parts)
                        .map(|p| p.length)
                        .sum(),
                    priority: 0,
                };
                (waiting, objects)
            })
            .collect();
        let ordered = policy.order(waiting, now);
        let bytes = ordered
            .iter()
            .flatten()
            .flat_map(|o| &o.parts)
            .map(|p| p.length)
            .sum();
        crate::monitor::queue(
            Role::Core,
            ordered.len(),
            ordered.iter().map(Vec::len).sum(),
            bytes,
        );
        Ok(ordered)
    };
    if let Some(addr) = args.daemon.metrics {
        crate::monitor::serve(addr)?;
    }
    let pull = |batch: Vec<ReadyObject>| -> BatchReport {
        let restore = Restore::new(settings.clone(), &identities, &trusted);
        let report = crate::monitor::while_running(
            Role::Core,
            &restore.pipeline,
            || {},
            || core.pull_batch(&restore, batch),
        );
        let outcome = if report.error.is_none() {
            BatchState::Delivered
        } else {
            BatchState::Failed
        };
        crate::monitor::batch_done(Role::Core, outcome);
        if !args.output.json {
            print_report(&report);
        }
        if let Some(e) = &report.error {
            failures.report(&report.batch, None, e);
        }
        report
    };
    // A puller killed after the relay took a batch's acknowledgement but before recording it
    // left files `delivered` that the relay no longer lists: ask the relay again.
    // One attempt: if the relay cannot be reached, the listing below retries and reports it.
    if let Ok(listed) = client.ready(true) {
        core.confirm_acknowledgements(&listed.iter().map(|o| o.id).collect());
    }
    if args.daemon.watch {
        println!(
            "pulling from {} every {} s (Ctrl-C stops; a restart resumes)",
            endpoint.url, args.daemon.interval
        );
        // While the edge is still sending a batch, look often: the core fetches and verifies
        // its sealed files ahead, and takes the batch as soon as it is sealed.
        let busy_poll = Duration::from_millis(200);
        loop {
            // One batch per listing, so a batch sealed meanwhile can go next if the policy
            // says so; after a delivery look again at once.
            let mut pause = Duration::from_secs(args.daemon.interval);
            match listing(true) {
                Ok(batches) => {
                    let (sealed, open): (Vec<_>, Vec<_>) =
                        batches.into_iter().partition(|b| b[0].batch_sealed);
                    if sealed.into_iter().any(|b| pull(b).error.is_none()) {
                        continue;
                    }
                    if !open.is_empty() {
                        pause = busy_poll;
                        let restore = Restore::new(settings.clone(), &identities, &trusted);
                        let fetched = crate::monitor::while_running(
                            Role::Core,
                            &restore.pipeline,
                            || {},
                            || open.into_iter().any(|b| core.fetch_ahead(&restore, b)),
                        );
                        if fetched {
                            continue;
                        }
                    }
                }
                Err(e) => failures.report("", None, &format!("{e:#}")),
            }
            std::thread::sleep(pause);
        }
    }
    let reports: Vec<BatchReport> = listing(false)?.into_iter().map(pull).collect();
    if args.output.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else if reports.is_empty() {
        println!("nothing waiting at the relay");
    }
    Ok(reports.iter().all(|r| r.error.is_none()))
}

/// Objects grouped by site and batch, in the order the relay listed them (oldest first).
fn group_by_batch(ready: Vec<ReadyObject>) -> Vec<Vec<ReadyObject>> {
    let mut groups: Vec<Vec<ReadyObject>> = Vec::new();
    for object in ready {
        match groups
            .iter_mut()
            .find(|g| g[0].site == object.site && g[0].batch == object.batch)
        {
            Some(group) => group.push(object),
            None => groups.push(vec![object]),
        }
    }
    groups
}

/// What every batch of one `pull` run shares.
struct Core<'a> {
    client: &'a RelayClient,
    retry: Retry,
    layout: &'a Layout,
    dest: &'a std::path::Path,
    copy_to: Option<&'a std::path::Path>,
    catalog: &'a Catalog,
    /// Batches still being sent whose sealed objects are already verified and staged, by
    /// batch key.
    ahead: Mutex<HashMap<BatchKey, Ahead>>,
}

/// A batch fetched ahead of its seal: objects verified and staged, nothing visible yet.
struct Ahead {
    staging: PathBuf,
    staged: Staged,
    started_at: i64,
    started: Instant,
    /// Fixed by the first objects fetched, so every file of the batch gets the same layout.
    batch_time: u64,
    name: Option<String>,
    /// Fetching ahead failed once: the batch is left for the whole pull after its seal,
    /// which reports what is wrong.
    failed: bool,
}

impl Ahead {
    /// Those of `objects` not staged yet.
    fn not_staged(&self, objects: Vec<ReadyObject>) -> Vec<ReadyObject> {
        let held: std::collections::HashSet<ObjectId> = self.staged.ids().collect();
        objects
            .into_iter()
            .filter(|o| !held.contains(&o.id))
            .collect()
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.staging);
    }
}

fn batch_key_of(objects: &[ReadyObject]) -> BatchKey {
    BatchKey::core(&objects[0].site, &objects[0].batch)
}

impl Core<'_> {
    /// Acknowledges again, at the relay, the batches this core's catalogue has delivered but
    /// not acknowledged and the relay no longer lists (the relay took the acknowledgement, and
    /// the puller was killed before recording it), and records the answer. A batch the relay
    /// still lists is left to the pull, which finds its files in place and acknowledges them.
    fn confirm_acknowledgements(&self, listed: &std::collections::HashSet<ObjectId>) {
        let Ok(batches) = self.catalog.batches() else {
            return;
        };
        for b in batches
            .into_iter()
            .filter(|b| b.role == Role::Core && b.state == BatchState::Delivered)
        {
            let (site, batch) = (b.batch_key.site(), b.batch_key.batch());
            let Ok(files) = self.catalog.files(&b.batch_key) else {
                continue;
            };
            let pending: Vec<_> = files
                .iter()
                .filter(|f| f.state == FileState::Delivered)
                .collect();
            let ids: Option<Vec<ObjectId>> =
                pending.iter().map(|f| f.object_id.parse().ok()).collect();
            let Some(ids) = ids.filter(|ids| !ids.is_empty()) else {
                continue;
            };
            if ids.iter().any(|id| listed.contains(id)) {
                continue;
            }
            if self.client.ack_batch(site, batch, &ids).is_err() {
                continue;
            }
            for f in pending {
                let (path, size) = (&f.path, f.size as u64);
                let file = FileRecord {
                    detail: Some("acknowledged again after an interrupted pull"),
                    ..FileRecord::new(&b.batch_key, &f.object_id, path, size, Acknowledged)
                };
                note("an acknowledgement", self.catalog.file_state(&file));
            }
        }
    }

    /// Verifies and stages the sealed objects of a batch the edge is still sending, so that
    /// little is left to do when its seal arrives. Nothing becomes visible and nothing is
    /// acknowledged. Returns whether there was anything new to fetch.
    fn fetch_ahead(&self, restore: &Restore, objects: Vec<ReadyObject>) -> bool {
        let batch_key = batch_key_of(&objects);
        let mut all = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        if all.get(&batch_key).is_some_and(|a| a.failed) {
            return false;
        }
        if !all.contains_key(&batch_key) {
            let Ok(ahead) = self.fresh_ahead(&objects, Instant::now(), now_us()) else {
                return false;
            };
            note(
                "a stage",
                self.catalog
                    .stage(&batch_key, Stage::Pull, ahead.started_at, None),
            );
            all.insert(batch_key.clone(), ahead);
        }
        let ahead = all.get_mut(&batch_key).expect("inserted above");
        let new = ahead.not_staged(objects);
        if new.is_empty() {
            return false;
        }
        match self.stage(restore, new, &batch_key, ahead) {
            Ok(more) => ahead.staged.extend(more),
            Err(e) => {
                eprintln!("batch {batch_key}: fetching ahead failed, the batch will be pulled whole after its seal: {e:#}");
                ahead.failed = true;
            }
        }
        true
    }

    fn fresh_ahead(
        &self,
        objects: &[ReadyObject],
        started: Instant,
        started_at: i64,
    ) -> Result<Ahead> {
        Ok(Ahead {
            staging: new_staging(self.dest)?,
            staged: Staged::default(),
            started_at,
            started,
            batch_time: objects.iter().map(|o| o.sealed_at).min().unwrap_or(0),
            name: None,
            failed: false,
        })
    }

    /// Verifies `objects` and stages them in the batch's staging directory.
    fn stage(
        &self,
        restore: &Restore,
        objects: Vec<ReadyObject>,
        batch_key: &BatchKey,
        ahead: &mut Ahead,
    ) -> Result<Staged> {
        let site = objects[0].site.clone();
        let fallback = objects[0].batch.clone();
        let source = RelaySource {
            client: self.client,
            retry: self.retry,
            catalog: self.catalog,
            batch_key,
            objects,
        };
        // The relay knows batches by opaque ids; the name is inside the verified manifests.
        let name = Mutex::new(ahead.name.clone());
        let batch_time = ahead.batch_time;
        let place = |m: &forte_format::Manifest| {
            let batch = if m.batch.is_empty() {
                fallback.as_str()
            } else {
                m.batch.as_str()
            };
            name.lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(|| batch.to_string());
            self.layout.render(&Fields {
                site: &site,
                batch,
                path: &m.path,
                batch_time,
            })
        };
        let staged = restore.stage(&source, self.dest, &place, &ahead.staging);
        ahead.name = name.into_inner().unwrap_or_else(|e| e.into_inner());
        staged
    }

    fn pull_batch(&self, restore: &Restore, objects: Vec<ReadyObject>) -> BatchReport {
        let (client, retry, catalog) = (self.client, self.retry, self.catalog);
        let site = objects[0].site.clone();
        let batch_key = batch_key_of(&objects);
        let sealed_bytes: u64 = objects
            .iter()
            .flat_map(|o| &o.parts)
            .map(|p| p.length)
            .sum();
        let count = objects.len() as u64;
        let record_batch = |name: &str, state: BatchState| {
            let record = BatchRecord {
                key: &batch_key,
                name,
                files: count,
                bytes: sealed_bytes,
                state,
            };
            note("a batch", catalog.batch_state(&record));
        };
        record_batch(&objects[0].batch, BatchState::Pulling);
        // What was fetched ahead is kept only if it all verified; else start afresh.
        let fetched = self
            .ahead
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&batch_key)
            .filter(|a| !a.failed);
        let (started, started_at) = fetched
            .as_ref()
            .map_or_else(|| (Instant::now(), now_us()), |a| (a.started, a.started_at));
        if fetched.is_none() {
            note(
                "a stage",
                catalog.stage(&batch_key, Stage::Pull, started_at, None),
            );
        }
        let ids: Vec<_> = objects.iter().map(|o| o.id).collect();
        let objects_batch = objects[0].batch.clone();
        let mut report = BatchReport {
            site: site.clone(),
            batch: objects[0].batch.clone(),
            objects: objects.len(),
            delivered_files: 0,
            already_delivered: 0,
            bytes: 0,
            seconds: 0.0,
            error: None,
            rejected_parts: Vec::new(),
        };
        let mut name = None;
        let ahead = match fetched {
            Some(ahead) => Ok(ahead),
            None => self.fresh_ahead(&objects, started, started_at),
        };
        let result = ahead.and_then(|mut ahead| {
            // The edge's signed list of the batch's objects: what the relay listed must be
            // exactly that, or nothing is delivered.
            let inventory = restore.inventory(&RelaySource {
                client,
                retry,
                catalog,
                batch_key: &batch_key,
                objects: objects.clone(),
            })?;
            let rest = ahead.not_staged(objects);
            if !rest.is_empty() {
                let more = self.stage(restore, rest, &batch_key, &mut ahead);
                name.clone_from(&ahead.name);
                ahead.staged.extend(more?);
            }
            name.clone_from(&ahead.name);
            restore.commit(
                std::mem::take(&mut ahead.staged),
                &ahead.staging,
                self.dest,
                inventory.as_ref(),
            )
        });
        if let Some(name) = name {
            report.batch = name;
        }
        // The second copy must exist before the relay may delete anything.
        let result = result.and_then(|delivered| match self.copy_to {
            Some(copy) => replicate(self.dest, copy, &delivered.placed).map(|_| delivered),
            None => Ok(delivered),
        });
        match result {
            Ok(delivered) => {
                if !delivered.inventory {
                    eprintln!(
                        "warning: batch {} of {site} carries no signed inventory (sealed by an edge before object format 2): every file was verified, but nothing proves that the relay offered all of them",
                        report.batch
                    );
                }
                report.delivered_files = delivered.files;
                report.already_delivered = delivered.already;
                report.bytes = delivered.bytes;
                for p in &delivered.placed {
                    let object = p.id.to_string();
                    for (index, raw, sealed) in &p.parts {
                        let hashes = PartHashes {
                            raw_sha256: Some(raw),
                            ciphertext_sha256: Some(sealed),
                            ..Default::default()
                        };
                        note(
                            "a verified part",
                            catalog.part_state(
                                &batch_key,
                                &object,
                                *index,
                                PartState::Verified,
                                &hashes,
                            ),
                        );
                    }
                    let file = FileRecord {
                        raw_sha256: Some(&p.sha256),
                        delivered_to: Some(&p.target),
                        detail: p.already.then_some("already in place from an earlier pull"),
                        ..FileRecord::new(&batch_key, &object, &p.path, p.size, Delivered)
                    };
                    note("a delivered file", catalog.file_state(&file));
                }
                // The whole batch at once: the relay never lists it again with some of its
                // objects gone, which its inventory would (rightly) refuse.
                let relay_batch = &objects_batch;
                match retry.run(
                    &format!("acknowledgement of batch {}", report.batch),
                    || client.ack_batch(&site, relay_batch, &ids),
                ) {
                    Ok(()) => {
                        for p in &delivered.placed {
                            let object = p.id.to_string();
                            let (path, size) = (&p.path, p.size);
                            let file =
                                FileRecord::new(&batch_key, &object, path, size, Acknowledged);
                            note("an acknowledgement", catalog.file_state(&file));
                        }
                    }
                    // Delivered but not acknowledged: the next pull finds the files in place
                    // and acknowledges then.
                    Err(e) => {
                        report.error =
                            Some(format!("delivered, but the acknowledgement failed: {e}"))
                    }
                }
            }
            Err(e) => {
                if let Some(failure) = e.downcast_ref::<RestoreFailure>() {
                    // Problems of the batch's set of objects (its inventory) name no part.
                    for p in &failure.problems {
                        let Some(part) = p.part else { continue };
                        let state = if p.damaged {
                            PartState::Damaged
                        } else {
                            PartState::Failed
                        };
                        let object = p.object.to_string();
                        note(
                            "a failed part",
                            catalog.part_state(
                                &batch_key,
                                &object,
                                part,
                                state,
                                &Default::default(),
                            ),
                        );
                    }
                    for p in failure.problems.iter().filter(|p| p.damaged) {
                        let Some(part) = p.part else { continue };
                        match client.reject(&site, p.object, part) {
                            Ok(()) => report
                                .rejected_parts
                                .push(format!("object {} part {part}", p.object)),
                            Err(e) => eprintln!(
                                "could not report damaged part {part} of object {}: {e}",
                                p.object
                            ),
                        }
                    }
                }
                report.error = Some(format!("{e:#}"));
            }
        }
        report.seconds = started.elapsed().as_secs_f64();
        let state = if report.error.is_none() {
            BatchState::Delivered
        } else {
            BatchState::Failed
        };
        record_batch(&report.batch, state);
        note(
            "a stage",
            catalog.stage(&batch_key, Stage::Pull, started_at, Some(now_us())),
        );
        report
    }
}

fn print_report(r: &BatchReport) {
    match &r.error {
        None => println!(
            "batch {} of {}: delivered {} files ({}) in {:.1} s ({:.1} MB/s){}, verified and acknowledged",
            r.batch,
            r.site,
            r.delivered_files,
            human(r.bytes),
            r.seconds,
            mb_per_s(r.bytes, r.seconds),
            if r.already_delivered > 0 { format!(", {} already in place", r.already_delivered) } else { String::new() }
        ),
        // The failure itself is logged once, by `Failures::report`.
        Some(_) => {
            for p in &r.rejected_parts {
                eprintln!("  reported damaged to the relay, which dropped it for the sender to upload again: {p}");
            }
        }
    }
}
