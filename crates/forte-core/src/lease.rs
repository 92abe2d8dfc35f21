//! This worker's hold on batches, so that several core workers sharing one relay and one
//! catalogue deliver each batch once (the leases themselves are `forte_catalog::Leases`).
//!
//! A batch is claimed before it is fetched ahead or delivered; a heartbeat renews the lease
//! while the worker works on it; the lease is checked again before each step the others can
//! see (files placed at the destination, then the delivery recorded and acknowledged), so a
//! worker that stalled past its lease and was overtaken stops there and leaves the batch to the
//! new holder. Placing a verified file is idempotent (one already in place with the same
//! SHA-256 is kept), which covers the one gap a lease cannot: a worker stopped between its last
//! check and the step after it.

use std::time::Duration;

use anyhow::Result;
use forte_catalog::{
    BatchKey, BatchRecord, BatchState, Catalog, Claim, Heartbeat, Holder, Lease, Leases, Role,
};
use forte_daemon::settings::Worker;

/// A batch this worker holds: its lease, renewed in the background until dropped. Dropping it
/// releases the lease, so that another worker may take the batch at once, unless the batch was
/// delivered ([`Held::delivered`]).
pub(super) struct Held {
    leases: Leases,
    lease: Lease,
    duration: Duration,
    heartbeat: Option<Heartbeat>,
    release: bool,
}

/// The lease was overtaken: another worker holds the batch now and will deliver it.
#[derive(Debug)]
pub(super) struct LeaseLost(pub String);

impl std::fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LeaseLost {}

impl Held {
    /// Claims `batch` for `worker`: `None` while another live worker holds it. A holder on this
    /// machine whose process is gone (killed) is overtaken at once rather than at its lease's
    /// end.
    pub(super) fn claim(
        leases: &Leases,
        worker: &Worker,
        batch: &BatchKey,
    ) -> Result<Option<Self>> {
        let mut claim = leases.claim(batch, &worker.name, worker.lease, None)?;
        if let Claim::Busy(holder) = &claim {
            if gone_from_this_machine(holder) {
                claim = leases.claim(batch, &worker.name, worker.lease, Some(holder))?;
            }
        }
        let Claim::Held(lease) = claim else {
            return Ok(None);
        };
        let heartbeat = Heartbeat::start(leases.clone(), lease.clone(), worker.lease);
        Ok(Some(Self {
            leases: leases.clone(),
            lease,
            duration: worker.lease,
            heartbeat: Some(heartbeat),
            release: true,
        }))
    }

    /// Whether the heartbeat found the lease overtaken (or could not renew it in time).
    pub(super) fn lost(&self) -> bool {
        self.heartbeat.as_ref().is_none_or(Heartbeat::lost)
    }

    /// Renews the lease now; fails with [`LeaseLost`], naming the new holder, unless this
    /// worker still holds the batch. Called before `step`, which others would see.
    pub(super) fn check(&self, step: &str) -> Result<()> {
        if !self.lost() && self.leases.renew(&self.lease, self.duration)? {
            return Ok(());
        }
        let now = match self.leases.holder(&self.lease.batch) {
            Ok(Some(h)) => format!("worker {} holds it (attempt {})", h.worker, h.attempt),
            _ => "another worker holds it".to_string(),
        };
        Err(LeaseLost(format!(
            "batch {}: this worker's lease (attempt {}) ran out before {step} and {now}; left to it",
            self.lease.batch, self.lease.attempt
        ))
        .into())
    }

    /// The lease itself, for a statement fenced by it.
    pub(super) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// This worker's name and attempt, for the lineage: `delivered by worker W (attempt N)`.
    pub(super) fn signature(&self) -> String {
        format!(
            "by worker {} (attempt {})",
            self.lease.worker, self.lease.attempt
        )
    }

    /// The batch is delivered and acknowledged: the lease is left to run out rather than
    /// released, so a worker that listed the batch just before the acknowledgement cannot
    /// claim it again meanwhile.
    pub(super) fn delivered(mut self) {
        self.release = false;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Stop renewing first: a renewal after the release would take the lease back.
        drop(self.heartbeat.take());
        if self.release {
            let _ = self.leases.release(&self.lease);
        }
    }
}

/// Refuses a worker name that a live process other than this one holds batches under: two
/// workers of one name would both hold the same batches (a worker restarted under its own
/// name, whose old process is gone, takes its batches back).
pub fn check_name_free(leases: &Leases, worker: &Worker) -> Result<()> {
    for process in leases.live_processes_of(&worker.name)? {
        let Some((host, pid)) = process.rsplit_once(':') else {
            continue;
        };
        let here = host == forte_usage::host_name();
        let alive = pid
            .parse()
            .is_ok_and(|pid: u32| forte_usage::process_alive(pid));
        if here && !alive {
            continue;
        }
        let where_ = if here {
            "this machine"
        } else {
            "another machine"
        };
        anyhow::bail!(
            "worker name {} is in use by process {process} on {where_}, which holds a live lease: give this worker another --worker name{}",
            worker.name,
            if here {
                String::new()
            } else {
                format!(", or wait {} s for its leases to run out if it is gone", worker.lease.as_secs())
            }
        );
    }
    Ok(())
}

/// Why a batch left pulling or checking by a pull that stopped is recorded failed.
pub const INTERRUPTED: &str = "interrupted: the pull delivering it stopped (killed, crashed or the machine lost power) before it finished; what it left was removed, and the batch is pulled again when the relay offers it";

/// Records failed each core batch that a pull left pulling or checking when it stopped
/// uncleanly and that no live worker holds now (a worker holds its batches only while it
/// runs): else the catalogue says for ever that it is being pulled, when the relay may never
/// offer it again (acknowledged by someone else, dropped). Run at start, once what that pull
/// left under the destination is removed; returns how many.
pub fn record_interrupted(catalog: &Catalog, worker: &Worker) -> Result<usize> {
    let leases = catalog.leases();
    let mut interrupted = 0;
    let batches = catalog.batches_in(&[BatchState::Pulling, BatchState::Checking])?;
    for b in batches.into_iter().filter(|b| b.role == Role::Core) {
        let abandoned = match leases.holder(&b.batch_key)? {
            None => true,
            Some(h) => !h.live || h.worker == worker.name || gone_from_this_machine(&h),
        };
        if !abandoned {
            continue;
        }
        let record = BatchRecord {
            key: &b.batch_key,
            name: &b.name,
            files: b.files.max(0) as u64,
            bytes: b.bytes.max(0) as u64,
            state: BatchState::Failed,
            arrived: None,
            detail: Some(INTERRUPTED),
        };
        catalog.batch_state(&record)?;
        interrupted += 1;
    }
    Ok(interrupted)
}

/// A holder named `HOST:PID` for this machine whose process is not running.
fn gone_from_this_machine(holder: &Holder) -> bool {
    let Some((host, pid)) = holder.worker.rsplit_once(':') else {
        return false;
    };
    host == forte_usage::host_name()
        && pid
            .parse()
            .is_ok_and(|pid| !forte_usage::process_alive(pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker name held by a live process elsewhere is refused; held by a process of this
    /// machine that is gone (a restart under its own name), it is free.
    #[test]
    fn a_worker_name_held_by_a_live_process_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let catalog =
            forte_catalog::Catalog::open(dir.path().join("c.sqlite").to_str().unwrap()).unwrap();
        let worker = Worker {
            name: "core-1".into(),
            lease: Duration::from_secs(60),
        };
        let here = forte_usage::host_name();
        // PID 0 is never a process of ours: gone.
        let gone = catalog.leases().as_process(&format!("{here}:0"));
        let batch = BatchKey::core("s", "b1");
        gone.claim(&batch, "core-1", worker.lease, None).unwrap();
        check_name_free(&catalog.leases(), &worker).expect("its process is gone");
        let elsewhere = catalog.leases().as_process("other-host:4242");
        elsewhere
            .claim(&BatchKey::core("s", "b2"), "core-1", worker.lease, None)
            .unwrap();
        let e = check_name_free(&catalog.leases(), &worker)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "worker name core-1 is in use by process other-host:4242 on another machine"
            ),
            "{e}"
        );
        let other_name = Worker {
            name: "core-2".into(),
            ..worker
        };
        check_name_free(&catalog.leases(), &other_name).expect("another name is free");
    }

    /// A batch left pulling or checking by a pull that was killed is recorded failed at the
    /// next start, with why; one a live worker elsewhere holds, or one never claimed but
    /// delivered, is left as it is.
    #[test]
    fn a_batch_an_interrupted_pull_left_is_recorded_failed() {
        let dir = tempfile::tempdir().unwrap();
        let catalog =
            forte_catalog::Catalog::open(dir.path().join("c.sqlite").to_str().unwrap()).unwrap();
        let worker = Worker {
            name: format!("{}:{}", forte_usage::host_name(), std::process::id()),
            lease: Duration::from_secs(60),
        };
        let record = |key: &BatchKey, state| {
            let b = BatchRecord {
                key,
                name: key.batch(),
                files: 1,
                bytes: 1,
                state,
                arrived: None,
                detail: None,
            };
            catalog.batch_state(&b).unwrap();
        };
        let here = forte_usage::host_name();
        let (killed, elsewhere, unclaimed, done) = (
            BatchKey::core("s", "killed"),
            BatchKey::core("s", "elsewhere"),
            BatchKey::core("s", "unclaimed"),
            BatchKey::core("s", "done"),
        );
        // The killed puller of this machine (PID 0: never running) held it while checking.
        let gone = catalog.leases().as_process(&format!("{here}:0"));
        gone.claim(&killed, &format!("{here}:0"), worker.lease, None)
            .unwrap();
        record(&killed, BatchState::Checking);
        let other = catalog.leases().as_process("other-host:4242");
        other
            .claim(&elsewhere, "other-host:4242", worker.lease, None)
            .unwrap();
        record(&elsewhere, BatchState::Pulling);
        record(&unclaimed, BatchState::Pulling);
        record(&done, BatchState::Delivered);

        assert_eq!(record_interrupted(&catalog, &worker).unwrap(), 2);
        let state = |key| catalog.batch(key).unwrap().unwrap().state;
        assert_eq!(state(&killed), BatchState::Failed);
        assert_eq!(state(&unclaimed), BatchState::Failed);
        assert_eq!(state(&elsewhere), BatchState::Pulling);
        assert_eq!(state(&done), BatchState::Delivered);
        let why = catalog.failures(Some(&killed), 1).unwrap();
        assert_eq!(why[0].error, INTERRUPTED);
    }
}
