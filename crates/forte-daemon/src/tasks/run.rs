//! Running a point's tasks on a batch: each task per file (its slots shared by the files) or
//! once, each try timed, killed at its timeout, tried again when it crashed, and recorded.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use forte_catalog::{now_us, BatchKey, TaskOutcome, TaskRun};
use parking_lot::Mutex;

use super::supervise::Supervision;
use super::{Per, Point, Task};
use crate::record::{note, Catalog};

/// A batch a point's tasks run on, where its files are now.
pub struct Subject<'a> {
    pub key: &'a BatchKey,
    pub site: &'a str,
    /// The batch's name.
    pub batch: &'a str,
    pub at: Point,
    pub dir: &'a Path,
    pub files: &'a [SubjectFile],
    /// Where the list of its files (`FORTE_FILES`) is written while its tasks run.
    pub list: PathBuf,
}

/// A file of a [`Subject`].
#[derive(Debug, Clone)]
pub struct SubjectFile {
    pub object_id: String,
    /// Its path in the batch, as the edge had it.
    pub path: String,
    /// Where it is under the subject's directory.
    pub under_dir: String,
    pub sha256: String,
    pub size: u64,
}

/// Why a task did not pass a batch, or one of its files.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub task: String,
    /// The file's path in the batch (a per-file task).
    pub file: Option<String>,
    pub outcome: TaskOutcome,
    /// Its last try's exit and the end of its output.
    pub reason: String,
    /// Its last try's whole output (stdout and stderr together).
    pub output: Vec<u8>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = match self.outcome {
            TaskOutcome::Refused => "refused",
            TaskOutcome::Changed => "changed",
            _ => "failed on",
        };
        match &self.file {
            Some(file) => write!(f, "task {} {verb} {file}: {}", self.task, self.reason),
            None => write!(f, "task {} {verb} the batch: {}", self.task, self.reason),
        }
    }
}

/// Runs `tasks` on `subject` in order, each only if those before it passed; what they refused
/// (every file a per-file task refused), empty when all passed. Every try is recorded.
pub fn check(tasks: &[&Task], subject: &Subject<'_>, catalog: &Catalog) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    for task in tasks {
        // Written again for each task: a task that rewrites the list (tasks share the
        // daemon's rights) misleads only itself, never the tasks after it.
        if let Err(e) = write_list(subject) {
            refusals = vec![Refusal {
                task: task.name.clone(),
                file: None,
                outcome: TaskOutcome::Crashed,
                reason: format!(
                    "cannot list the batch's files for its tasks in {}: {e}",
                    subject.list.display()
                ),
                output: Vec::new(),
            }];
            break;
        }
        refusals = match task.per {
            Per::Batch => run_task(task, subject, None, catalog, now_us())
                .err()
                .into_iter()
                .collect(),
            Per::File => per_file(task, subject, catalog),
        };
        if !refusals.is_empty() {
            break;
        }
    }
    let _ = std::fs::remove_file(&subject.list);
    refusals
}

/// The list of the subject's files for `FORTE_FILES` (outside its directory: the list is not
/// part of the batch): each file's absolute path ended by a NUL byte, the one byte no path
/// holds (a name may hold a newline).
fn write_list(subject: &Subject<'_>) -> std::io::Result<()> {
    let dir = absolute(subject.dir);
    let mut text = Vec::new();
    for f in subject.files {
        text.extend_from_slice(dir.join(&f.under_dir).as_os_str().as_bytes());
        text.push(0);
    }
    if let Some(dir) = subject.list.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A fresh file: never written through whatever a task left at its name (a symlink).
    match std::fs::remove_file(&subject.list) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::io::Write::write_all(&mut std::fs::File::create_new(&subject.list)?, &text)
}

/// `path` made absolute, whatever directory the daemon started in: a task runs in its workdir.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A per-file task on every file, `concurrency` at once; the files it refused.
fn per_file(task: &Task, subject: &Subject<'_>, catalog: &Catalog) -> Vec<Refusal> {
    let next = AtomicUsize::new(0);
    let refused = Mutex::new(Vec::new());
    let queued_at = now_us();
    std::thread::scope(|scope| {
        for _ in 0..task.concurrency.clamp(1, subject.files.len().max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(file) = subject.files.get(i) else {
                    break;
                };
                let run = run_task(task, subject, Some(file), catalog, queued_at);
                if let Err(refusal) = run {
                    refused.lock().push((i, refusal));
                }
            });
        }
    });
    let mut refused = refused.into_inner();
    refused.sort_by_key(|(i, _)| *i);
    refused.into_iter().map(|(_, r)| r).collect()
}

/// A task's tries on the subject (or one of its files), ready from `queued_at`, until one
/// passes, one refuses, a crash or timeout has no retry left, or it cannot start.
fn run_task(
    task: &Task,
    subject: &Subject<'_>,
    file: Option<&SubjectFile>,
    catalog: &Catalog,
    mut queued_at: i64,
) -> Result<(), Refusal> {
    for try_number in 1..=task.retries + 1 {
        let started_at = now_us();
        let tried = try_once(task, &environment(task, subject, file, try_number));
        let ended_at = now_us();
        let recorded = catalog.task_run(&TaskRun {
            batch: subject.key,
            task: &task.name,
            // At the edge a file has no object yet.
            object_id: file
                .map(|f| f.object_id.as_str())
                .filter(|id| !id.is_empty()),
            try_number,
            queued_at,
            started_at,
            ended_at,
            outcome: tried.outcome,
            detail: tried.reason.as_deref(),
        });
        note("a task's try", recorded);
        crate::monitor::task_try(
            &task.name,
            tried.outcome,
            (started_at - queued_at) as f64 / 1e6,
            (ended_at - started_at) as f64 / 1e6,
        );
        let again = matches!(tried.outcome, TaskOutcome::Crashed | TaskOutcome::TimedOut)
            && tried.started
            && try_number <= task.retries;
        if tried.outcome == TaskOutcome::Passed {
            return Ok(());
        }
        if !again {
            return Err(Refusal {
                task: task.name.clone(),
                file: file.map(|f| f.path.clone()),
                outcome: tried.outcome,
                reason: tried.reason.unwrap_or_default(),
                output: tried.output,
            });
        }
        queued_at = ended_at;
    }
    unreachable!("the last try returns")
}

/// What a task is told (see the module's table).
fn environment(
    task: &Task,
    subject: &Subject<'_>,
    file: Option<&SubjectFile>,
    try_number: u32,
) -> Vec<(&'static str, String)> {
    let (dir, list) = (absolute(subject.dir), absolute(&subject.list));
    let mut env = vec![
        ("FORTE_TASK", task.name.clone()),
        ("FORTE_AT", subject.at.as_str().to_owned()),
        ("FORTE_SITE", subject.site.to_owned()),
        ("FORTE_BATCH", subject.batch.to_owned()),
        ("FORTE_BATCH_DIR", dir.display().to_string()),
        ("FORTE_FILES", list.display().to_string()),
        ("FORTE_TRY", try_number.to_string()),
    ];
    if let Some(f) = file {
        env.extend([
            ("FORTE_FILE", dir.join(&f.under_dir).display().to_string()),
            ("FORTE_PATH", f.path.clone()),
            ("FORTE_SHA256", f.sha256.clone()),
            ("FORTE_SIZE", f.size.to_string()),
        ]);
    }
    env
}

/// One try's end.
struct Tried {
    outcome: TaskOutcome,
    /// Whether the command started (one that cannot start is not tried again).
    started: bool,
    reason: Option<String>,
    output: Vec<u8>,
}

/// How often a running try is looked at for its end or its timeout, at most: the first looks
/// come sooner (1 ms, then doubling), so a quick task costs about its own time, not a whole
/// interval (20 ms each, 40 s for 2 000 files, before).
const POLL: Duration = Duration::from_millis(20);
/// How long a try's output is waited for once its processes were killed: only a process that
/// left its process group (without a PID namespace) can hold the pipe open longer.
const OUTPUT_AFTER_END: Duration = Duration::from_secs(2);
/// The end of a try's output that its reason quotes.
const REASON_TAIL: usize = 1000;

/// Runs the task's command once with `env`, its stdout and stderr read together, and kills its
/// process group at the timeout.
fn try_once(task: &Task, env: &[(&'static str, String)]) -> Tried {
    let (reader, writer) = match std::io::pipe() {
        Ok(pipe) => pipe,
        Err(e) => return cannot_start(task, e),
    };
    let mut child = match spawn_held(task, env, writer) {
        Ok(child) => child,
        Err(e) => return cannot_start(task, e),
    };
    let output = read_in_background(reader);
    let timed_out = wait_until_ended_or(&child, task.timeout);
    // Whatever the try left in its group goes with it (with a PID namespace, all of it went
    // when its process 1 ended): killed before the first process is reaped, while its pid
    // still names the group.
    // SAFETY: kill(2) on the process group the child leads; no memory involved.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let status = child.wait().ok();
    // Only a process that left the group can still hold the pipe: its output is not waited for.
    let output = output.recv_timeout(OUTPUT_AFTER_END).unwrap_or_default();
    let Judged { outcome, exit } = match status {
        _ if timed_out => Judged {
            outcome: TaskOutcome::TimedOut,
            exit: format!("killed at its timeout of {} s", task.timeout.as_secs_f64()),
        },
        Some(status) => judge(status),
        None => Judged {
            outcome: TaskOutcome::Crashed,
            exit: "its end could not be read".to_owned(),
        },
    };
    let reason = (outcome != TaskOutcome::Passed).then(|| with_tail(&exit, &output));
    Tried {
        outcome,
        started: true,
        reason,
        output,
    }
}

/// The end of a try whose command could not start (`e`): a crash, not tried again.
fn cannot_start(task: &Task, e: std::io::Error) -> Tried {
    Tried {
        outcome: TaskOutcome::Crashed,
        started: false,
        reason: Some(format!(
            "cannot start `{}` in {}: {e}; fix `command` or `workdir` of [[task]] {} in the configuration file",
            task.argv.join(" "),
            task.workdir.display(),
            task.name
        )),
        output: Vec::new(),
    }
}

/// Starts the task's command with `env`, held as [`Supervision::here`] holds tries, its stdout
/// and stderr both to `writer`.
fn spawn_held(
    task: &Task,
    env: &[(&'static str, String)],
    writer: std::io::PipeWriter,
) -> std::io::Result<Child> {
    let mut command = Command::new(&task.argv[0]);
    command
        .args(&task.argv[1..])
        .current_dir(&task.workdir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    Supervision::here().hold(&mut command);
    let spawned = writer
        .try_clone()
        .map(|out| command.stdout(out).stderr(writer))
        .and_then(|c| c.spawn());
    // The parent's copies of the pipe's writing end are gone with `command`: the reader ends
    // when the task and its children have closed theirs.
    drop(command);
    spawned
}

/// Reads everything from `reader` on a thread of its own; the output comes once it ends.
fn read_in_background(mut reader: std::io::PipeReader) -> Receiver<Vec<u8>> {
    let (output_to, output) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut output = Vec::new();
        let _ = reader.read_to_end(&mut output);
        let _ = output_to.send(output);
    });
    output
}

/// Waits until the child ends (or cannot be looked at), or `timeout` has passed: whether it
/// timed out.
fn wait_until_ended_or(child: &Child, timeout: Duration) -> bool {
    let started = Instant::now();
    let mut timed_out = false;
    let mut poll = Duration::from_millis(1);
    loop {
        match ended(child) {
            Ok(true) => break,
            Ok(false) if started.elapsed() >= timeout => {
                timed_out = true;
                break;
            }
            Ok(false) => {
                std::thread::sleep(poll);
                poll = (poll * 2).min(POLL);
            }
            Err(_) => break,
        }
    }
    timed_out
}

/// Whether the child has ended, without reaping it: its pid, and so its process group's id,
/// stays its own until it is waited for.
fn ended(child: &std::process::Child) -> std::io::Result<bool> {
    // SAFETY: waitid fills the siginfo we own.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    if unsafe { libc::waitid(libc::P_PID, child.id(), &mut info, flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: si_pid is set by waitid (0 while the child runs).
    Ok(unsafe { info.si_pid() } != 0)
}

/// How a try ended: its outcome, and its exit in words.
struct Judged {
    outcome: TaskOutcome,
    /// The exit in words ("exit 1", "crashed: killed by signal 9"), which the reason begins
    /// with.
    exit: String,
}

/// A finished try's outcome and its exit in words.
fn judge(status: ExitStatus) -> Judged {
    let judged = |outcome, exit| Judged { outcome, exit };
    match (status.code(), status.signal()) {
        (Some(0), _) => judged(TaskOutcome::Passed, "exit 0".to_owned()),
        (Some(1), _) => judged(TaskOutcome::Refused, "exit 1".to_owned()),
        (Some(code), _) => judged(TaskOutcome::Crashed, format!("crashed with exit {code}")),
        (None, Some(signal)) => judged(
            TaskOutcome::Crashed,
            format!("crashed: killed by signal {signal}"),
        ),
        (None, None) => judged(TaskOutcome::Crashed, format!("crashed: {status}")),
    }
}

/// `exit`, and the end of `output` after a colon where it said anything.
fn with_tail(exit: &str, output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let text = text.trim();
    if text.is_empty() {
        return exit.to_owned();
    }
    let start = text.len().saturating_sub(REASON_TAIL);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    let cut = if start > 0 { "…" } else { "" };
    format!("{exit}: {cut}{}", &text[start..])
}
