//! Telling people about failures: a log line per failed attempt (through `tracing`, target
//! `forte::failure`, so the operator's log format decides how it looks), and an optional
//! command (`--on-failure`) such as a mail or chat alert, as the papers' pipeline sent e-mails.
//!
//! A failure is a *state* of a subject, not an event: the subject is a batch of one site (by
//! its id at the relay, which the core knows before it can read the batch's signed name), or
//! the daemon's own listing of work (no batch). A file that fails is a failure of its batch
//! (`FORTE_FILE` names the file of the latest failure): a batch of a thousand files that all
//! fail is one alert, not a thousand. The hook runs
//!
//! - once when a subject starts failing (`FORTE_EVENT=failed`),
//! - while it keeps failing, again only after `repeat_after`, then after twice that, doubling
//!   to at most a day (`FORTE_EVENT=failing`, `FORTE_FAILURES` the failures since it started),
//! - once when it clears (`FORTE_EVENT=cleared`): its batch was delivered, sent, cancelled, or
//!   the listing answered again, or (at the core) the relay no longer offers it.
//!
//! The state lives in the running daemon's memory: a restarted daemon may say `failed` once
//! more for a subject still failing. Hooks run one after another on a thread of their own, so
//! a slow or hung hook never holds up a transfer; each is given [`HOOK_TIMEOUT`], then killed
//! with its process group. A daemon that ends waits for the hooks it queued.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use forte_catalog::Role;
use parking_lot::Mutex;
use std::sync::mpsc::{Receiver, Sender};

/// The first interval after which a failure that persists is told again (`--on-failure-repeat`).
pub const REPEAT_AFTER: Duration = Duration::from_secs(3600);
/// The longest interval between two reminders of one failure.
pub const REPEAT_AT_MOST: Duration = Duration::from_secs(24 * 3600);
/// How long one run of the hook may take before it is killed.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// Where failures are reported; clones share their state and their hook runner.
#[derive(Clone)]
pub struct Failures {
    pub role: Role,
    /// Run with `sh -c` (`--on-failure`); see the module's documentation for when and with what.
    hook: Option<Arc<Hooks>>,
    repeat_after: Duration,
    failing: Arc<Mutex<HashMap<Subject, Failing>>>,
}

/// What failed, as a caller says it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Failure<'a> {
    /// The batch's site; empty when not known (yet).
    pub site: &'a str,
    /// The batch's name (its directory at the edge, the signed name at the core); empty for a
    /// failure of no batch (the relay could not be listed).
    pub batch: &'a str,
    /// The batch's id as the relay knows it; the subject when given, else the name.
    pub batch_id: &'a str,
    /// The file, when only this file failed.
    pub file: Option<&'a str>,
    pub error: &'a str,
}

/// What a failure is a state of: a batch, by its id (the listing when empty). Ids are derived
/// from an edge's secret, so two sites' batches never share one; the site is not part of the
/// subject because an edge may learn its site from the relay after a batch first failed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Subject {
    batch_id: String,
}

/// A subject failing since `since`.
#[derive(Debug)]
struct Failing {
    /// The names it was last reported with (the core learns a batch's name as it reads it).
    site: String,
    batch: String,
    file: Option<String>,
    error: String,
    /// Failures since it started.
    failures: u64,
    /// Times told again while failing, and when it may be told again next.
    repeats: u32,
    next: Instant,
}

/// How a subject's state changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Failed,
    Failing,
    Cleared,
}

impl Event {
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Failed => "failed",
            Event::Failing => "failing",
            Event::Cleared => "cleared",
        }
    }
}

/// The interval after the `repeats`-th reminder of a failure: `first`, doubling, at most a day
/// (or `first` when that is longer).
pub fn repeat_interval(first: Duration, repeats: u32) -> Duration {
    first
        .saturating_mul(1u32 << repeats.min(20))
        .min(REPEAT_AT_MOST.max(first))
}

impl Failures {
    /// Failures of `role`, told through `command` if given, again after `repeat_after` while
    /// they persist.
    pub fn new(role: Role, command: Option<String>, repeat_after: Duration) -> Self {
        Self {
            role,
            hook: command.map(|c| Arc::new(Hooks::start(c))),
            repeat_after,
            failing: Arc::default(),
        }
    }

    /// Logs a failed attempt, and runs the hook if the subject starts failing or is due a
    /// reminder.
    pub fn report(&self, failure: &Failure) {
        crate::monitor::failure(self.role);
        let f = failure;
        tracing::error!(
            target: "forte::failure",
            role = %self.role.as_str(),
            site = f.site,
            batch = f.batch,
            batch_id = f.batch_id,
            file = f.file.unwrap_or(""),
            error = %f.error,
            "{} failure{}{}",
            self.role.as_str(),
            if f.batch.is_empty() { "" } else { ", batch " },
            f.batch,
        );
        let subject = Subject {
            batch_id: if f.batch_id.is_empty() {
                f.batch
            } else {
                f.batch_id
            }
            .to_owned(),
        };
        let told = self.record(subject, f, Instant::now());
        if let Some((event, failures)) = told {
            self.run_hook(event, f, failures);
        }
    }

    /// Updates the subject's state; the event to tell and the failures since it started, if
    /// one is due.
    fn record(&self, subject: Subject, f: &Failure, now: Instant) -> Option<(Event, u64)> {
        let mut failing = self.failing.lock();
        let Some(state) = failing.get_mut(&subject) else {
            let state = Failing {
                site: f.site.to_owned(),
                batch: f.batch.to_owned(),
                file: f.file.map(str::to_owned),
                error: f.error.to_owned(),
                failures: 1,
                repeats: 0,
                next: now + repeat_interval(self.repeat_after, 0),
            };
            failing.insert(subject, state);
            return Some((Event::Failed, 1));
        };
        state.failures += 1;
        state.error = f.error.to_owned();
        if !f.site.is_empty() {
            state.site = f.site.to_owned();
        }
        state.file = f.file.map(str::to_owned);
        if !f.batch.is_empty() {
            state.batch = f.batch.to_owned();
        }
        if now < state.next {
            return None;
        }
        state.repeats += 1;
        state.next = now + repeat_interval(self.repeat_after, state.repeats);
        Some((Event::Failing, state.failures))
    }

    /// The batch `batch_id` of `site` (or its name when it has no id; the listing when both
    /// are empty) succeeded: each of its subjects that was failing is told cleared, once.
    /// `batch` is its name, if known now.
    pub fn cleared(&self, site: &str, batch_id: &str, batch: &str) {
        let id = if batch_id.is_empty() { batch } else { batch_id };
        self.clear_where(|s, _| s.batch_id == id, site, batch);
    }

    /// Clears every failing batch of which `listed(site, batch_id)` says the relay no longer
    /// offers it: cancelled at its edge, or delivered by another worker. Returns the (site,
    /// batch id) of each.
    pub fn clear_unlisted(&self, listed: impl Fn(&str, &str) -> bool) -> Vec<(String, String)> {
        let ends =
            |s: &Subject, f: &Failing| !s.batch_id.is_empty() && !listed(&f.site, &s.batch_id);
        self.clear_where(ends, "", "")
    }

    /// Tells each failing subject that `ends` cleared, with `site` and named `batch` if given,
    /// else as it was last reported.
    fn clear_where(
        &self,
        ends: impl Fn(&Subject, &Failing) -> bool,
        site: &str,
        batch: &str,
    ) -> Vec<(String, String)> {
        let ended: Vec<(Subject, Failing)> = {
            let mut failing = self.failing.lock();
            let gone: Vec<Subject> = failing
                .iter()
                .filter(|(s, f)| ends(s, f))
                .map(|(s, _)| s.clone())
                .collect();
            gone.into_iter()
                .filter_map(|s| failing.remove_entry(&s))
                .collect()
        };
        let cleared = ended
            .iter()
            .map(|(subject, state)| (state.site.clone(), subject.batch_id.clone()))
            .collect();
        for (subject, state) in ended {
            let name = if batch.is_empty() {
                &state.batch
            } else {
                batch
            };
            let failure = Failure {
                site: if site.is_empty() { &state.site } else { site },
                batch: name,
                batch_id: &subject.batch_id,
                file: state.file.as_deref(),
                error: &state.error,
            };
            tracing::info!(
                target: "forte::failure",
                role = %self.role.as_str(),
                site = failure.site,
                batch = failure.batch,
                batch_id = failure.batch_id,
                failures = state.failures,
                "{} failure cleared{}{} after {} failure(s)",
                self.role.as_str(),
                if name.is_empty() { "" } else { ", batch " },
                name,
                state.failures
            );
            self.run_hook(Event::Cleared, &failure, state.failures);
        }
        cleared
    }

    /// A one-off alert about `site` that its caller tells once (a sequence gap): logged, and
    /// the hook run with `FORTE_EVENT=failed` and no batch; nothing clears it.
    pub fn alert(&self, site: &str, error: &str) {
        crate::monitor::failure(self.role);
        tracing::error!(
            target: "forte::failure",
            role = %self.role.as_str(),
            site,
            error = %error,
            "{} alert, site {site}",
            self.role.as_str()
        );
        let failure = Failure {
            site,
            error,
            ..Failure::default()
        };
        self.run_hook(Event::Failed, &failure, 1);
    }

    /// Queues the hook's run for `event`, if there is a hook.
    fn run_hook(&self, event: Event, f: &Failure, failures: u64) {
        let Some(hook) = &self.hook else { return };
        let env = vec![
            ("FORTE_EVENT", event.as_str().to_owned()),
            ("FORTE_ROLE", self.role.as_str().to_owned()),
            ("FORTE_SITE", f.site.to_owned()),
            ("FORTE_BATCH", f.batch.to_owned()),
            ("FORTE_BATCH_ID", f.batch_id.to_owned()),
            ("FORTE_FILE", f.file.unwrap_or("").to_owned()),
            ("FORTE_ERROR", f.error.to_owned()),
            ("FORTE_FAILURES", failures.to_string()),
        ];
        hook.queue(env);
    }
}

/// One run's environment: `FORTE_EVENT`, `FORTE_ROLE`, … and their values.
type HookEnv = Vec<(&'static str, String)>;

/// The hook's runner: one thread that runs each queued run in turn, so that `cleared` never
/// overtakes the `failed` before it, and the transfer never waits for a hook.
struct Hooks {
    send: Mutex<Option<Sender<HookEnv>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Hooks {
    fn start(command: String) -> Self {
        let (send, receive) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("on-failure".into())
            .spawn(move || run_hooks(&command, &receive))
            .expect("a thread for the failure hook");
        Self {
            send: Mutex::new(Some(send)),
            thread: Mutex::new(Some(thread)),
        }
    }

    fn queue(&self, env: HookEnv) {
        if let Some(send) = &*self.send.lock() {
            let _ = send.send(env);
        }
    }
}

impl Drop for Hooks {
    /// The daemon ends: the hooks queued still run (each within its timeout).
    fn drop(&mut self) {
        self.send.lock().take();
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

fn run_hooks(command: &str, queued: &Receiver<HookEnv>) {
    for env in queued {
        run_hook(command, env, HOOK_TIMEOUT);
    }
}

/// Runs `command` once with `env`, in a process group of its own, killed with its group after
/// `timeout`.
fn run_hook(command: &str, env: HookEnv, timeout: Duration) {
    let child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .envs(env)
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            tracing::warn!("cannot run the --on-failure command: {e}");
            return;
        }
    };
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        match child.try_wait() {
            Ok(Some(s)) if s.success() => return,
            Ok(Some(s)) => return tracing::warn!("the --on-failure command exited with {s}"),
            Ok(None) if Instant::now() >= deadline => break,
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Err(e) => return tracing::warn!("cannot wait for the --on-failure command: {e}"),
        }
    }
    // SAFETY: kill(2) on the hook's own process group, which it leads (process_group(0)).
    unsafe {
        libc::kill(-(child.id() as i32), libc::SIGKILL);
    }
    let _ = child.wait();
    tracing::warn!(
        "the --on-failure command ran longer than {} s: killed",
        timeout.as_secs()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reminders_double_from_the_first_interval_to_a_day() {
        let hour = Duration::from_secs(3600);
        let schedule: Vec<u64> = (0..7)
            .map(|n| repeat_interval(hour, n).as_secs() / 3600)
            .collect();
        assert_eq!(schedule, [1, 2, 4, 8, 16, 24, 24]);
        assert_eq!(repeat_interval(hour, 1000), REPEAT_AT_MOST);
        let minute = Duration::from_secs(60);
        assert_eq!(repeat_interval(minute, 3), Duration::from_secs(480));
        // A first interval longer than a day is kept.
        let week = Duration::from_secs(7 * 24 * 3600);
        assert_eq!(repeat_interval(week, 2), week);
    }

    #[test]
    fn a_failing_subject_is_told_once_then_after_each_interval_then_cleared() {
        let failures = Failures::new(Role::Core, None, Duration::from_secs(10));
        let t0 = Instant::now();
        let f = Failure {
            site: "s",
            batch: "b1",
            batch_id: "id1",
            file: None,
            error: "no",
        };
        let subject = || Subject {
            batch_id: "id1".into(),
        };
        let at = |s: u64| t0 + Duration::from_secs(s);
        let told: Vec<_> = [0, 1, 9, 10, 11, 29, 30, 31, 70]
            .into_iter()
            .map(|s| failures.record(subject(), &f, at(s)))
            .collect();
        use Event::*;
        assert_eq!(
            told,
            [
                Some((Failed, 1)),
                None,
                None,
                Some((Failing, 4)),
                None,
                None,
                Some((Failing, 7)),
                None,
                Some((Failing, 9)),
            ]
        );
        failures.cleared("s", "id1", "b1");
        assert!(failures.failing.lock().is_empty());
        assert_eq!(failures.record(subject(), &f, at(71)), Some((Failed, 1)));
    }
}
