//! How a task's processes are held, so that none outlives its try, its timeout or its puller.
//!
//! Each try runs as process 1 of a PID namespace of its own. When process 1 ends, the kernel
//! kills every other process of the namespace, whatever it did to get away (a background job,
//! `setsid`, a double fork): nothing of the try is left, and nothing holds its output pipe. The
//! chain up to the puller is held by parent-death signals: the try's process 1 is the child of
//! a small waiter (the process the puller spawned, which ends as the try ended), and each gets
//! SIGKILL when its parent dies. So a puller killed by any means (even `kill -9`) takes the
//! waiter with it, the waiter process 1, and process 1 the whole namespace: no task process
//! survives it, and a restarted puller finds nothing of a dead one's tasks still writing.
//! Process 1 itself is a keeper, not the task: the task runs as process 2, so that it gets
//! signals as any process does (process 1 ignores those it has no handler for, even its own
//! `kill -SEGV $$`).
//!
//! Each try also gets a mount namespace of its own, every mount in it private: a mount the
//! task makes (a bind mount over a landed file, a tmpfs over its batch) is seen by its own
//! processes only, never by the puller or the host, and goes with the namespace when the try's
//! last process ends. Without it a mount made by a task running as root outlived the task and
//! was promoted with the batch, so whoever owned what it showed could rewrite a delivered file.
//!
//! Creating these namespaces needs CAP_SYS_ADMIN (root) or an unprivileged user namespace (then
//! the try's own uid and gid are mapped to themselves). Where neither is allowed, a try runs in
//! a process group of its own, killed whole when its first process ends or times out: a
//! process that left the group (`setsid`) can then outlive it, which `pull` warns about at start.

use std::ffi::CStr;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::OnceLock;

/// How tries are held on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Supervision {
    /// A PID and a mount namespace per try (as root).
    Namespace,
    /// A PID and a mount namespace inside a user namespace per try (as another user).
    UserNamespace,
    /// A process group per try: what leaves the group can outlive the try.
    ProcessGroup,
}

impl Supervision {
    /// How tries are held here: probed once, by starting `true` each way.
    pub fn here() -> Supervision {
        static HERE: OnceLock<Supervision> = OnceLock::new();
        *HERE.get_or_init(|| {
            [Supervision::Namespace, Supervision::UserNamespace]
                .into_iter()
                .find(|way| {
                    let mut probe = Command::new("true");
                    way.hold(&mut probe);
                    probe
                        .stdin(std::process::Stdio::null())
                        .status()
                        .is_ok_and(|s| s.success())
                })
                .unwrap_or(Supervision::ProcessGroup)
        })
    }

    /// What an operator should know about it, if anything.
    pub fn warning(self) -> Option<&'static str> {
        (self == Supervision::ProcessGroup).then_some(
            "tasks run in a process group of their own, not PID and mount namespaces (which need root or unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1): a process a task starts with setsid can outlive its try and its puller, and a mount it makes stays",
        )
    }

    /// Sets `command` up to run held this way: in a process group of its own (which a timeout
    /// kills whole), killed with its puller, and in a PID and a mount namespace of its own.
    pub fn hold(self, command: &mut Command) {
        command.process_group(0);
        let parent = std::process::id() as libc::pid_t;
        // Everything the child needs is made here: after fork, in a child of a threaded
        // process, nothing may allocate.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let id_maps = [
            (c"/proc/self/setgroups", b"deny".to_vec()),
            (c"/proc/self/uid_map", format!("{uid} {uid} 1").into_bytes()),
            (c"/proc/self/gid_map", format!("{gid} {gid} 1").into_bytes()),
        ];
        let self_ = self;
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe functions (prctl, getppid, unshare, mount, open, read, write,
        // close, close_range, pipe2, fcntl, fork, waitpid, signal, kill, _exit) on data made
        // before the fork.
        unsafe {
            command.pre_exec(move || {
                die_with_parent(parent);
                let flags = match self_ {
                    Supervision::ProcessGroup => return Ok(()),
                    Supervision::Namespace => libc::CLONE_NEWPID | libc::CLONE_NEWNS,
                    Supervision::UserNamespace => {
                        libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWUSER
                    }
                };
                enter_namespaces(flags, self_ == Supervision::UserNamespace, &id_maps)?;
                start_keepers()
            });
        }
    }
}

/// Moves this (forked, not yet exec'd) process into new namespaces (`flags`, for `unshare`):
/// with a user namespace (`map_ids`) its uid and gid mapped to themselves (`id_maps`), and
/// every mount made private.
unsafe fn enter_namespaces(
    flags: libc::c_int,
    map_ids: bool,
    id_maps: &[(&CStr, Vec<u8>)],
) -> std::io::Result<()> {
    if libc::unshare(flags) != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if map_ids {
        for (path, text) in id_maps {
            write_file(path, text)?;
        }
    }
    // The new mount namespace is a copy of the puller's, and shared mounts (the
    // default under systemd) would still pass the task's mounts back to it: made
    // private, none of them leaves the namespace.
    let private = libc::MS_REC | libc::MS_PRIVATE;
    if libc::mount(
        std::ptr::null(),
        c"/".as_ptr(),
        std::ptr::null(),
        private,
        std::ptr::null(),
    ) != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Forks the chain that holds the try: this process stays as the waiter, its child is process
/// 1 of the new PID namespace, and that one's child, process 2, returns here to exec the task.
unsafe fn start_keepers() -> std::io::Result<()> {
    // The waiter holds the writing end of `alive` until it ends: process 1 asks for
    // its parent-death signal, then sees whether the waiter already ended (in the
    // new namespace its parent has no pid it could ask about). Process 1 hands the
    // task's end to the waiter through `status`: process 1 cannot end by a signal
    // of its own, the waiter can.
    let (mut alive, mut status) = ([0; 2], [0; 2]);
    if libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC) != 0
        || libc::pipe2(status.as_mut_ptr(), libc::O_CLOEXEC) != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    match libc::fork() {
        -1 => Err(std::io::Error::last_os_error()),
        0 => keep_as_process_1(alive, status),
        init => wait_as_waiter(init, alive[1], status[0]),
    }
}

/// Process 1 of the new namespace: ends at once if the waiter already has, then forks the task
/// (process 2, which returns to be exec'd) and hands its end to the waiter through `status`.
unsafe fn keep_as_process_1(
    alive: [libc::c_int; 2],
    status: [libc::c_int; 2],
) -> std::io::Result<()> {
    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    libc::close(alive[1]);
    let mut byte = 0u8;
    libc::fcntl(alive[0], libc::F_SETFL, libc::O_NONBLOCK);
    if libc::read(alive[0], (&mut byte as *mut u8).cast(), 1) == 0 {
        libc::_exit(137);
    }
    libc::close(alive[0]);
    libc::close(status[0]);
    match libc::fork() {
        -1 => libc::_exit(127),
        // Process 2: the task, once exec'd.
        0 => {
            libc::close(status[1]);
            Ok(())
        }
        task => {
            only_keep(status[1]);
            let ended = wait_for(task);
            libc::write(status[1], (&ended as *const i32).cast(), 4);
            libc::_exit(0)
        }
    }
}

/// The waiter, holding `alive` open until it ends: waits for process 1 (`init`) and ends as
/// the task ended, as process 1 told through `status` (else as process 1 ended).
unsafe fn wait_as_waiter(init: libc::pid_t, alive: libc::c_int, status: libc::c_int) -> ! {
    only_keep_both(alive, status);
    let init_ended = wait_for(init);
    let mut ended = 0i32;
    let got = libc::read(status, (&mut ended as *mut i32).cast(), 4);
    end_as(if got == 4 { ended } else { init_ended })
}

/// Asks for SIGKILL when the parent dies, and dies now if it already has.
unsafe fn die_with_parent(parent: libc::pid_t) {
    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    if libc::getppid() != parent {
        libc::_exit(137);
    }
}

/// Closes every descriptor but `keep`: the task's output pipe and std's pipe that tells the
/// puller the exec succeeded must end with the task, not with its keepers.
unsafe fn only_keep(keep: libc::c_int) {
    only_keep_both(keep, keep);
}

/// [`only_keep`] for two descriptors.
unsafe fn only_keep_both(a: libc::c_int, b: libc::c_int) {
    let (low, high) = (a.min(b) as u32, a.max(b) as u32);
    let close = |from: u32, to: u32| {
        if from <= to {
            libc::syscall(libc::SYS_close_range, from, to, 0u32);
        }
    };
    if low > 0 {
        close(0, low - 1);
    }
    if high > low {
        close(low + 1, high - 1);
    }
    close(high + 1, u32::MAX);
}

/// Waits for the child `pid`; its wait status.
unsafe fn wait_for(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    loop {
        let done = libc::waitpid(pid, &mut status, 0);
        if done == pid {
            return status;
        }
        if done == -1 && *libc::__errno_location() != libc::EINTR {
            // As if killed: what else can have taken it.
            return libc::SIGKILL;
        }
    }
}

/// Ends this process as wait status `status` says the task ended: the same exit status, or
/// killed by the same signal.
unsafe fn end_as(status: i32) -> ! {
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        libc::signal(signal, libc::SIG_DFL);
        libc::kill(libc::getpid(), signal);
        libc::_exit(128 + signal);
    }
    libc::_exit(libc::WEXITSTATUS(status))
}

/// Writes `text` to the file at `path` (a /proc file: one write).
unsafe fn write_file(path: &CStr, text: &[u8]) -> std::io::Result<()> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let written = libc::write(fd, text.as_ptr().cast(), text.len());
    libc::close(fd);
    if written != text.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
