//! A real S3 server for tests: versitygw serving a directory, each subdirectory a bucket and
//! each object a file at its key, so a test can look at what was stored as files.
//! (`.ci/run` installs versitygw from the Go module proxy.)

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::Credentials;

pub const ACCESS: &str = "forte-test-access";
pub const SECRET: &str = "forte-test-secret-0123456789";

/// A versitygw process serving `root` on a free port, killed when dropped.
pub struct S3Server {
    child: Child,
    pub root: PathBuf,
    pub endpoint: String,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// versitygw from $FORTE_TEST_VERSITYGW or ~/go/bin; `None` (the test skipped, loudly) outside
/// CI when there is none; in CI its absence fails the test.
fn versitygw() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("FORTE_TEST_VERSITYGW").map(PathBuf::from),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/bin/versitygw")),
        Some(PathBuf::from("/usr/local/bin/versitygw")),
    ];
    if let Some(found) = candidates.into_iter().flatten().find(|p| p.exists()) {
        return Some(found);
    }
    assert!(
        std::env::var("CI").is_err(),
        "versitygw not found: CI must run the S3 tests (.ci/run installs it with go install)"
    );
    eprintln!(
        "SKIPPED: no versitygw (go install github.com/versity/versitygw/cmd/versitygw@v1.8.0)"
    );
    None
}

impl S3Server {
    /// Serves `root`, creating the directories of `buckets` in it first.
    pub fn start(root: &Path, buckets: &[&str]) -> Option<Self> {
        let binary = versitygw()?;
        for b in buckets {
            std::fs::create_dir_all(root.join(b)).unwrap();
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(binary)
            .args([
                "--access", ACCESS, "--secret", SECRET, "--port", &addr, "posix",
            ])
            .arg(root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let up = (0..400).any(|_| {
            std::thread::sleep(Duration::from_millis(25));
            std::net::TcpStream::connect(&addr).is_ok()
        });
        assert!(up, "versitygw did not start on {addr}");
        Some(Self {
            child,
            root: root.to_path_buf(),
            endpoint: format!("http://{addr}"),
        })
    }

    /// This server's endpoint and keys, for [`crate::Bucket::open`].
    pub fn credentials(&self) -> Credentials {
        Credentials {
            endpoint: Some(self.endpoint.clone()),
            access_key_id: Some(ACCESS.into()),
            secret_access_key: Some(SECRET.into()),
            region: Some("us-east-1".into()),
        }
    }

    /// The same as environment variables, for a `forte` process (`secret` in place of the
    /// right one, to test refusal).
    pub fn env(&self, secret: &str) -> [(&'static str, String); 4] {
        [
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", ACCESS.into()),
            ("AWS_SECRET_ACCESS_KEY", secret.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }
}
