//! A site with a running `forte relay`, an inbox and a destination: the stage of the network
//! tests.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use super::*;

pub const EDGE_TOKEN: &str = "edge-site-a-0123456789abcdef";
/// A second site's edge token (`site-b`, in `edge-b.token`), for tests of sites sending at once.
pub const EDGE_B_TOKEN: &str = "edge-site-b-0123456789abcdef";
pub const CORE_TOKEN: &str = "core-token-0123456789abcdef";

/// A `forte relay` child process, killed when dropped.
pub struct Relay {
    pub child: Child,
    pub url: String,
    pub fingerprint: String,
    pub store: PathBuf,
    pub listen: String,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a relay on `listen` (`127.0.0.1:0` for any free port).
pub fn start_relay(root: &Path, listen: &str) -> Relay {
    start_relay_with(root, listen, &[])
}

/// Starts a relay with extra flags (`--quota-per-site 1MiB`).
pub fn start_relay_with(root: &Path, listen: &str, flags: &[&str]) -> Relay {
    let store = root.join("relay");
    spawn_relay(
        root,
        listen,
        (store.as_os_str(), &store),
        flags,
        Stdio::inherit(),
        &[],
    )
}

/// Starts a relay on any free port whose log (stderr) goes to `log`.
pub fn start_relay_logging_to(root: &Path, log: &Path) -> Relay {
    let log = std::fs::File::create(log).unwrap();
    let store = root.join("relay");
    spawn_relay(
        root,
        "127.0.0.1:0",
        (store.as_os_str(), &store),
        &[],
        Stdio::from(log),
        &[],
    )
}

/// Starts a relay on `listen` whose store is the bucket `url` of the S3 server with the
/// endpoint and keys in `env`, the bucket's files under `tree`; its log (appended) in `log`.
pub fn start_bucket_relay(
    root: &Path,
    listen: &str,
    url: &str,
    tree: &Path,
    env: &[(&'static str, String)],
    log: &Path,
) -> Relay {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let store = (std::ffi::OsStr::new(url), tree);
    spawn_relay(root, listen, store, &[], Stdio::from(log), env)
}

/// `store`: the `--store` argument, and where its files are.
fn spawn_relay(
    root: &Path,
    listen: &str,
    (store_arg, store): (&std::ffi::OsStr, &Path),
    flags: &[&str],
    stderr: Stdio,
    env: &[(&'static str, String)],
) -> Relay {
    let tokens = root.join("tokens.toml");
    write(
        &tokens,
        format!(
            "[[token]]\ntoken = \"{EDGE_TOKEN}\"\nrole = \"edge\"\nsite = \"site-a\"\n\
             [[token]]\ntoken = \"{EDGE_B_TOKEN}\"\nrole = \"edge\"\nsite = \"site-b\"\n\
             [[token]]\ntoken = \"{CORE_TOKEN}\"\nrole = \"core\"\nsites = [\"*\"]\n"
        )
        .as_bytes(),
    );
    let mut child = forte()
        .args(["relay", "--listen", listen, "--store"])
        .arg(store_arg)
        .arg("--tokens")
        .arg(&tokens)
        .args(flags)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut url, mut fingerprint) = (String::new(), String::new());
    while url.is_empty() || fingerprint.is_empty() {
        let line = lines.next().expect("relay output").unwrap();
        if let Some(u) = line.strip_prefix("relay listening on ") {
            url = u.to_string();
        }
        if let Some(i) = line.find("sha256 fingerprint ") {
            fingerprint = line[i + 19..].trim_end_matches(')').to_string();
        }
    }
    // Keep draining its output so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    write(&root.join("edge.token"), EDGE_TOKEN.as_bytes());
    write(&root.join("edge-b.token"), EDGE_B_TOKEN.as_bytes());
    write(&root.join("core.token"), CORE_TOKEN.as_bytes());
    let listen = url.trim_start_matches("https://").to_string();
    Relay {
        child,
        url,
        fingerprint,
        store: store.to_path_buf(),
        listen,
    }
}

pub struct Site {
    _tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub keys: Keys,
    pub relay: Relay,
    /// Catalogue URLs of the edge and the core.
    pub edge_catalog: String,
    pub core_catalog: String,
}

impl Site {
    pub fn new() -> Self {
        Self::with_relay_flags(&[])
    }

    /// A site whose relay runs with extra flags.
    pub fn with_relay_flags(flags: &[&str]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let keys = keygen(&root.join("keys"));
        let relay = start_relay_with(&root, "127.0.0.1:0", flags);
        let (edge_catalog, core_catalog) = (
            root.join("edge.sqlite").display().to_string(),
            root.join("core.sqlite").display().to_string(),
        );
        Self {
            _tmp: tmp,
            root,
            keys,
            relay,
            edge_catalog,
            core_catalog,
        }
    }

    /// The same site with both catalogues in one fresh PostgreSQL database.
    pub fn with_postgres() -> Option<Self> {
        let base = match std::env::var("FORTE_TEST_POSTGRES") {
            Ok(url) => url,
            Err(_) if std::env::var("CI").is_ok() => {
                panic!("FORTE_TEST_POSTGRES is not set: CI must run the PostgreSQL tests (./test.sh starts one)")
            }
            Err(_) => {
                eprintln!("SKIPPED: set FORTE_TEST_POSTGRES (./test.sh does, with .ci/postgres.sh) to run the PostgreSQL end-to-end test");
                return None;
            }
        };
        // One database per site: tests of one binary run at once.
        static SITES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let db = format!("forte_e2e_{}_{n}", std::process::id());
        stdout_of(
            tool("psql")
                .arg(&base)
                .args(["-qAtc", &format!("DROP DATABASE IF EXISTS {db}")]),
        );
        stdout_of(
            tool("psql")
                .arg(&base)
                .args(["-qAtc", &format!("CREATE DATABASE {db}")]),
        );
        let url = format!("{}/{db}", base.rsplit_once('/').unwrap().0);
        let mut site = Self::new();
        site.edge_catalog = url.clone();
        site.core_catalog = url;
        Some(site)
    }

    /// `forte report` over the site's edge and core catalogues, with `extra` flags.
    pub fn report(&self, extra: Args) -> Args {
        let mut a = args![
            "--catalog",
            &self.edge_catalog,
            "report",
            "--with",
            &self.core_catalog
        ];
        a.extend(extra);
        a
    }

    pub fn status(&self, catalog: &str, extra: &[&str]) -> String {
        let mut a = args!["--catalog", catalog, "status"];
        a.extend(extra.iter().map(Into::into));
        ok(&a)
    }

    pub fn relay_args(&self, token: &str) -> Args {
        args![
            "--relay",
            &self.relay.url,
            "--relay-fingerprint",
            &self.relay.fingerprint,
            "--token-file",
            self.root.join(token),
        ]
    }

    pub fn send(&self, extra: &[&str]) -> Args {
        let mut a = args![
            "--catalog",
            &self.edge_catalog,
            "send",
            self.root.join("inbox"),
            "--recipient",
            &self.keys.core_pub,
            "--sign",
            &self.keys.edge_key,
            "--receipt-pub",
            &self.keys.receipt_pub,
            "--site",
            "site-a"
        ];
        a.extend(self.relay_args("edge.token"));
        a.extend(extra.iter().map(Into::into));
        a
    }

    pub fn pull(&self) -> Args {
        let mut a = args![
            "--catalog",
            &self.core_catalog,
            "pull",
            "--to",
            self.root.join("dest"),
            "--identity",
            &self.keys.core_key,
            "--trust",
            format!("site-a={}", self.keys.edge_pub.display()),
            "--receipt-key",
            &self.keys.receipt_key,
            "-q",
        ];
        a.extend(self.relay_args("core.token"));
        a
    }

    /// Parts and manifests stored at the relay right now.
    pub fn relay_objects(&self) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let objects = self.relay.store.join("sites/site-a/objects");
        for o in std::fs::read_dir(objects).into_iter().flatten().flatten() {
            // An object acknowledged meanwhile is gone: it is not held.
            let entries = std::fs::read_dir(o.path()).into_iter().flatten().flatten();
            found.extend(entries.map(|e| e.path()));
        }
        found.sort();
        found
    }

    /// The objects and sealed batches the relay's store holds for any site: what was uploaded.
    pub fn relay_holdings(&self) -> Vec<PathBuf> {
        let sites = std::fs::read_dir(self.relay.store.join("sites"));
        let kinds = sites
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|site| ["objects", "batches"].map(|kind| site.path().join(kind)));
        let held = kinds.flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten());
        held.map(|e| e.path()).collect()
    }

    /// The length of each part and manifest stored at the relay right now, once the relay has
    /// finished every body it was writing (a killed sender's last request may still be landing).
    pub fn relay_object_lengths(&self) -> BTreeMap<PathBuf, u64> {
        let tmp = self.relay.store.join("sites/site-a/tmp");
        let mut last = BTreeMap::new();
        for _ in 0..50 {
            let now: BTreeMap<PathBuf, u64> = self
                .relay_objects()
                .into_iter()
                .map(|p| {
                    let len = std::fs::metadata(&p).unwrap().len();
                    (p, len)
                })
                .collect();
            let writing = std::fs::read_dir(&tmp).map_or(0, |d| d.count());
            if now == last && writing == 0 {
                return now;
            }
            last = now;
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("the relay's store did not settle: {last:?}");
    }
}

impl Site {
    /// `send` for a second site, `site-b`: its own inbox (`inbox-b`), catalogue, token and
    /// signing key `edge` (the core must `--trust` its public key).
    pub fn send_as_site_b(&self, edge: &Keys, extra: &[&str]) -> Args {
        let mut a = args![
            "--catalog",
            self.root.join("edge-b.sqlite"),
            "send",
            self.root.join("inbox-b"),
            "--recipient",
            &self.keys.core_pub,
            "--sign",
            &edge.edge_key,
            "--site",
            "site-b"
        ];
        a.extend(self.relay_args("edge-b.token"));
        a.extend(extra.iter().map(Into::into));
        a
    }

    /// [`Site::send`] with no site given: neither `--site` nor a configuration file.
    pub fn send_without_site(&self, extra: &[&str]) -> Args {
        let mut a = self.send(extra);
        let at = a
            .iter()
            .position(|x| x == "--site")
            .expect("send gives --site");
        a.drain(at..at + 2);
        a
    }

    /// The relay's tokens.toml with the names of site-a and site-b swapped (site-a's token now
    /// site-b's and the other way round, or back), put in force with SIGHUP, as a relay
    /// operator would; returns once the relay answers with the new names.
    pub fn swap_site_names_at_the_relay(&self) {
        let client = forte_relay::client::RelayClient::new(
            &forte_relay::client::RelayEndpoint {
                url: self.relay.url.clone(),
                token: EDGE_TOKEN.into(),
                trust: forte_relay::tls::RelayTrust::Fingerprint(self.relay.fingerprint.clone()),
            },
            std::time::Duration::from_secs(10),
        )
        .unwrap();
        let before = client.site().unwrap();
        let tokens = self.root.join("tokens.toml");
        let text = std::fs::read_to_string(&tokens).unwrap();
        let swapped = text
            .replace("site = \"site-a\"", "site = \"was-a\"")
            .replace("site = \"site-b\"", "site = \"site-a\"")
            .replace("site = \"was-a\"", "site = \"site-b\"");
        write(&tokens, swapped.as_bytes());
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.relay.child.id() as i32, libc::SIGHUP) };
        assert!(
            wait_for(10, || client.site().is_ok_and(|s| s != before)),
            "the relay did not reload tokens.toml"
        );
    }

    /// `send` of the inbox with the core's recipient but another edge's signing key.
    pub fn send_signed_by(&self, edge: &Keys) -> Args {
        let mut a = args![
            "send",
            self.root.join("inbox"),
            "--recipient",
            &self.keys.core_pub,
            "--sign",
            &edge.edge_key,
            "--site",
            "site-a",
            "-q"
        ];
        a.extend(self.relay_args("edge.token"));
        a
    }

    /// Restarts the relay on the same address and store (after it was killed).
    pub fn restart_relay(&mut self) {
        let _ = self.relay.child.kill();
        let _ = self.relay.child.wait();
        let listen = self.relay.listen.clone();
        self.relay = start_relay(&self.root, &listen);
    }
}

/// Waits up to 120 s until the files visible in `dest` are exactly `expected`; else fails,
/// saying how many arrived, with `logs` (the daemons' output).
pub fn assert_all_arrive(
    dest: &Path,
    expected: &std::collections::BTreeMap<String, String>,
    logs: impl Fn() -> String,
) {
    assert!(
        wait_for(120, || visible(dest) == *expected),
        "not everything arrived: {} of {} files{}",
        visible(dest).len(),
        expected.len(),
        logs()
    );
}

/// Waits up to `seconds` for `done`, polling; false if it never came.
pub fn wait_for(seconds: u64, mut done: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    while std::time::Instant::now() < until {
        if done() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    done()
}

/// A loopback address with a port free at the moment of asking.
pub fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// `GET path` at `addr` (HTTP/1.0, with `headers`, each `Name: value`): the status and the
/// body; `None` while nothing answers there.
pub fn http_get(addr: &str, path: &str, headers: &[&str]) -> Option<(u16, String)> {
    let (head, body) = http_exchange(addr, "localhost", path, headers)?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body))
}

/// [`http_get`] naming `host` in its `Host` header.
pub fn http_get_as(addr: &str, host: &str, path: &str) -> Option<(u16, String)> {
    let (head, body) = http_exchange(addr, host, path, &[])?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body))
}

/// The head of the answer to `GET path` (status line and headers, lower-cased names).
pub fn http_head(addr: &str, path: &str, headers: &[&str]) -> Option<String> {
    http_exchange(addr, "localhost", path, headers).map(|(head, _)| head)
}

fn http_exchange(addr: &str, host: &str, path: &str, headers: &[&str]) -> Option<(String, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    let mut request = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n");
    for h in headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    Some((head.to_owned(), body.to_owned()))
}

/// `GET /metrics` at `addr`, parsed as Prometheus' text format; `None` while not served.
pub fn scrape(addr: &str) -> Option<prometheus_parse::Scrape> {
    let (status, body) = http_get(addr, "/metrics", &[])?;
    assert_eq!(status, 200, "GET /metrics at {addr}: {body}");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    Some(prometheus_parse::Scrape::parse(lines).expect("Prometheus text format"))
}

/// The value of the sample `metric` whose labels include all of `labels` that the endpoint at
/// `addr` serves now, if any.
pub fn scraped(addr: &str, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape(addr).and_then(|s| sample(&s, metric, labels))
}

/// Every sample of `scrape` (from `at`) belongs to a family with a `# HELP` line (a summary's
/// `_sum` and `_count` to the summary's).
pub fn assert_described(scrape: &prometheus_parse::Scrape, at: &str) {
    for s in &scrape.samples {
        let family = ["_sum", "_count"]
            .iter()
            .find_map(|suffix| s.metric.strip_suffix(suffix))
            .filter(|family| scrape.docs.contains_key(*family))
            .unwrap_or(&s.metric);
        assert!(
            scrape.docs.contains_key(family),
            "no # HELP for {} at {at}",
            s.metric
        );
    }
}

/// The value of the sample `metric` whose labels include all of `labels`, if any.
pub fn sample(
    scrape: &prometheus_parse::Scrape,
    metric: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => panic!("{metric} is not a single number"),
        })
}

/// A child process killed (SIGKILL) when dropped.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spawn(args: &Args) -> Daemon {
    Daemon(
        forte()
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

pub fn kill(daemon: &mut Daemon) {
    let _ = daemon.0.kill();
    let _ = daemon.0.wait();
}

/// Files visible under `dir`, relative path → SHA-256: what a user of the destination sees.
/// Staging directories (`.forte-staging-*`) are skipped, because a running or killed pull
/// legitimately leaves them; where the guarantee says none may be left (after a one-shot pull
/// that finished, successfully or not), assert it with [`assert_no_staging`].
pub fn visible(dir: &Path) -> std::collections::BTreeMap<String, String> {
    if !dir.exists() {
        return Default::default();
    }
    tree(dir)
        .into_iter()
        .filter(|(p, _)| !p.starts_with(".forte-staging-"))
        // forte's own records beside what it delivered: the instances it delivered and the
        // earlier versions of files it replaced (their directories too, empty for the moment
        // the core makes them).
        .filter(|(p, _)| !forte_records(p))
        .map(|(p, v)| (p, v.split(' ').next().unwrap().to_string()))
        .collect()
}

/// [`tree`] of a destination without forte's own records beside the delivered files (the
/// instances it delivered, the earlier versions it replaced): what it delivered.
pub fn delivered_tree(dest: &Path) -> std::collections::BTreeMap<String, String> {
    tree(dest)
        .into_iter()
        .filter(|(p, _)| !forte_records(p))
        .collect()
}

/// Whether `path` (relative to a destination) is of forte's own records beside what it
/// delivered: under `.forte-custody` or `.forte-replaced`, or one of them.
fn forte_records(path: &str) -> bool {
    [".forte-custody", ".forte-replaced"].iter().any(|dir| {
        path.strip_prefix(dir)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// The names of the staging directories (`.forte-staging-*`) in `dest`, sorted.
pub fn staging_dirs(dest: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(dest)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".forte-staging-"))
        .collect();
    found.sort();
    found
}

/// Fails the test if a staging directory is left in `dest`: none may be once a one-shot pull
/// has finished, whether it delivered or failed. `when` says which pull, for the message.
pub fn assert_no_staging(dest: &Path, when: &str) {
    let left = staging_dirs(dest);
    assert!(
        left.is_empty(),
        "staging directories left in {} {when}: {left:?} holding {:?}",
        dest.display(),
        left.iter()
            .map(|d| tree(&dest.join(d)).into_keys().collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
}

pub fn source_hashes(batch: &Path) -> std::collections::BTreeMap<String, String> {
    visible(batch)
        .into_iter()
        .filter(|(p, _)| p != ".ready")
        .collect()
}

/// Like [`spawn`], with everything the daemon says in `log`: its output and its log lines
/// (level from `FORTE_TEST_LOG`, default info), for tests to assert on and show when they fail.
pub fn spawn_logged(args: &Args, log: &Path) -> Daemon {
    let out = std::fs::File::create(log).unwrap();
    Daemon(
        forte()
            .args(args)
            .env(
                "FORTE_LOG",
                std::env::var("FORTE_TEST_LOG").unwrap_or("info".into()),
            )
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap(),
    )
}

/// A ready batch `name` in `inbox`: `files` files of `size` sample bytes under `bags/`.
pub fn write_batch(inbox: &Path, name: &str, files: usize, size: usize) -> PathBuf {
    let dir = inbox.join(name);
    for i in 0..files {
        write(
            &dir.join(format!("bags/{i:03}.bag")),
            &sample_bytes(size, i as u64 + name.len() as u64),
        );
    }
    write(&dir.join(".ready"), b"");
    dir
}

/// Sends `signal` to `daemon` and waits (up to `within` seconds) for it to end; its exit
/// status, `None` if it did not end.
pub fn signal_and_wait(
    daemon: &mut Daemon,
    signal: i32,
    within: u64,
) -> Option<std::process::ExitStatus> {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(daemon.0.id() as i32, signal) };
    let mut status = None;
    wait_for(within, || {
        status = daemon.0.try_wait().ok().flatten();
        status.is_some()
    });
    status
}

/// Copies a directory tree.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).into_iter().flatten().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A pull's standard error, asserting it succeeded.
pub fn pulled(site: &Site) -> String {
    let out = run(&site.pull());
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}
