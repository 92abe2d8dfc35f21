//! Real resources a test borrows from the machine: a small filesystem that fills up, and a
//! PostgreSQL server of its own that it can stop and start. Both need root (CI runs as root).
//! Outside CI a test without them says SKIPPED; in CI it fails, never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether the test can have the machine's resources; panics in CI when it cannot.
pub fn may_use_the_machine(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var("CI").is_err(),
        "{what} needs root: CI must run this test as root (.ci/run)"
    );
    eprintln!("SKIPPED: {what} needs root");
    false
}

/// A tmpfs of a fixed size mounted on a directory; unmounted when dropped (lazily, so a
/// daemon still holding files in it does not keep it mounted).
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` on `dir` (created if needed); `None` when not root outside CI.
    pub fn mount(dir: &Path, bytes: u64) -> Option<Self> {
        if !may_use_the_machine("a size-limited filesystem") {
            return None;
        }
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(status.success(), "mount -t tmpfs on {}", dir.display());
        Some(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// Fills the filesystem with a ballast file until `leave` bytes are free; returns its path.
    pub fn fill_leaving(&self, leave: u64) -> PathBuf {
        let ballast = self.dir.join("ballast");
        let free = self.free();
        let size = free.saturating_sub(leave);
        let file = std::fs::File::create(&ballast).unwrap();
        // tmpfs allocates on write, not on set_len: write the bytes.
        use std::io::Write;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        let chunk = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            out.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
        out.flush().unwrap();
        ballast
    }

    /// Bytes free for an unprivileged writer.
    pub fn free(&self) -> u64 {
        let path = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statvfs writes into the zeroed struct we own; the path is NUL-terminated.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut stat) }, 0);
        stat.f_bavail * stat.f_frsize
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// A PostgreSQL server of the test's own (a fresh cluster in a temporary directory, trust
/// authentication on loopback), so it can be stopped and started without disturbing the
/// server other tests share. Stopped and removed when dropped.
pub struct PrivatePostgres {
    bin: PathBuf,
    data: PathBuf,
    root: PathBuf,
    _tmp: tempfile::TempDir,
    pub port: u16,
}

impl PrivatePostgres {
    pub fn start() -> Option<Self> {
        if !may_use_the_machine("a private PostgreSQL server") {
            return None;
        }
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|b| b.join("initdb").exists())
            .max()
            .expect("PostgreSQL's server binaries under /usr/lib/postgresql (apt-get install postgresql; ./test.sh does)");
        let tmp = tempfile::Builder::new()
            .prefix("forte-pg-")
            .tempdir()
            .unwrap();
        let root = tmp.path().to_path_buf();
        let (uid, gid) = postgres_user();
        std::os::unix::fs::chown(&root, Some(uid), Some(gid)).unwrap();
        let data = root.join("data");
        let port: u16 = super::site::free_addr()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let server = Self {
            bin,
            data,
            root,
            _tmp: tmp,
            port,
        };
        server.as_postgres(&[
            "initdb",
            "-D",
            server.data.to_str().unwrap(),
            "-A",
            "trust",
            "-U",
            "forte",
            "--no-sync",
        ]);
        server.start_again();
        server.as_postgres(&[
            "createdb",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "forte",
            "forte",
        ]);
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("postgres://forte@127.0.0.1:{}/forte", self.port)
    }

    /// Stops the server now (fast shutdown: open connections are cut).
    pub fn stop(&self) {
        self.as_postgres(&[
            "pg_ctl",
            "-D",
            self.data.to_str().unwrap(),
            "-m",
            "fast",
            "-w",
            "stop",
        ]);
    }

    /// Starts the (stopped) server and waits until it accepts connections.
    pub fn start_again(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.root.display()
        );
        self.as_postgres(&[
            "pg_ctl",
            "-D",
            self.data.to_str().unwrap(),
            "-o",
            &options,
            "-l",
            self.root.join("server.log").to_str().unwrap(),
            "-w",
            "start",
        ]);
    }

    fn as_postgres(&self, command: &[&str]) {
        let program = self.bin.join(command[0]);
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(&program)
            .args(&command[1..])
            .current_dir(&self.root)
            .output()
            .expect("running runuser");
        assert!(
            out.status.success(),
            "{} failed: {}{}",
            command.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

/// The uid and gid of the `postgres` account the Debian package creates.
fn postgres_user() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<_> = l.split(':').collect();
            (f[0] == "postgres").then(|| (f[2].parse().unwrap(), f[3].parse().unwrap()))
        })
        .expect("a postgres user (apt-get install postgresql; ./test.sh does)")
}
