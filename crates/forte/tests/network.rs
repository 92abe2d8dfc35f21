//! Edge → relay → core with the real binary in three roles, over real TLS on loopback.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use common::*;

const EDGE_TOKEN: &str = "edge-site-a-0123456789abcdef";
const CORE_TOKEN: &str = "core-token-0123456789abcdef";

/// A `forte relay` child process, killed when dropped.
struct Relay {
    child: Child,
    url: String,
    fingerprint: String,
    store: PathBuf,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_relay(root: &Path) -> Relay {
    let tokens = root.join("tokens.toml");
    write(
        &tokens,
        format!(
            "[[token]]\ntoken = \"{EDGE_TOKEN}\"\nrole = \"edge\"\nsite = \"site-a\"\n\
             [[token]]\ntoken = \"{CORE_TOKEN}\"\nrole = \"core\"\nsites = [\"*\"]\n"
        )
        .as_bytes(),
    );
    let store = root.join("relay");
    let mut child = forte()
        .args(["relay", "--listen", "127.0.0.1:0", "--store"])
        .arg(&store)
        .arg("--tokens")
        .arg(&tokens)
        .stdout(Stdio::piped())
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
    write(&root.join("core.token"), CORE_TOKEN.as_bytes());
    Relay {
        child,
        url,
        fingerprint,
        store,
    }
}

struct Site {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    keys: Keys,
    relay: Relay,
    /// Catalogue URLs of the edge and the core.
    edge_catalog: String,
    core_catalog: String,
}

impl Site {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let keys = keygen(&root.join("keys"));
        let relay = start_relay(&root);
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
    fn with_postgres() -> Option<Self> {
        let base = match std::env::var("FORTE_TEST_POSTGRES") {
            Ok(url) => url,
            Err(_) if std::env::var("CI").is_ok() => {
                panic!("FORTE_TEST_POSTGRES is not set: CI must run the PostgreSQL tests (.ci/run starts a server)")
            }
            Err(_) => {
                eprintln!("SKIPPED: set FORTE_TEST_POSTGRES (see .ci/postgres.sh) to run the PostgreSQL end-to-end test");
                return None;
            }
        };
        let db = format!("forte_e2e_{}", std::process::id());
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

    fn status(&self, catalog: &str, extra: &[&str]) -> String {
        let mut a = args!["--catalog", catalog, "status"];
        a.extend(extra.iter().map(Into::into));
        ok(&a)
    }

    fn relay_args(&self, token: &str) -> Args {
        args![
            "--relay",
            &self.relay.url,
            "--relay-fingerprint",
            &self.relay.fingerprint,
            "--token-file",
            self.root.join(token),
        ]
    }

    fn send(&self, extra: &[&str]) -> Args {
        let mut a = args![
            "--catalog",
            &self.edge_catalog,
            "send",
            self.root.join("inbox"),
            "--recipient",
            &self.keys.core_pub,
            "--sign",
            &self.keys.edge_key
        ];
        a.extend(self.relay_args("edge.token"));
        a.extend(extra.iter().map(Into::into));
        a
    }

    fn pull(&self) -> Args {
        let mut a = args![
            "--catalog",
            &self.core_catalog,
            "pull",
            "--to",
            self.root.join("dest"),
            "--identity",
            &self.keys.core_key,
            "--trust",
            &self.keys.edge_pub,
            "-q",
        ];
        a.extend(self.relay_args("core.token"));
        a
    }

    /// Parts and manifests stored at the relay right now.
    fn relay_objects(&self) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let objects = self.relay.store.join("sites/site-a/objects");
        for o in std::fs::read_dir(objects).into_iter().flatten().flatten() {
            found.extend(
                std::fs::read_dir(o.path())
                    .unwrap()
                    .map(|e| e.unwrap().path()),
            );
        }
        found.sort();
        found
    }
}

fn make_batches(inbox: &Path) {
    for (batch, bags) in [
        ("truck-7-run-1", 3usize),
        ("truck-7-run-2", 1),
        ("truck-9-run-1", 2),
    ] {
        let dir = inbox.join(batch);
        for i in 0..bags {
            write(
                &dir.join(format!("bags/{i:03}.bag")),
                &sample_bytes((5 << 20) / 2 + i * 1000, i as u64 + 1),
            );
        }
        write(&dir.join("logs/vehicle.log"), &sample_bytes(350_000, 99));
        write(&dir.join(".ready"), b"");
    }
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap()
}

#[test]
fn batches_arrive_identical_under_the_layout_and_exactly_once() {
    end_to_end(Site::new());
}

#[test]
fn end_to_end_with_the_catalogue_on_postgresql() {
    if let Some(site) = Site::with_postgres() {
        end_to_end(site);
    }
}

fn end_to_end(site: Site) {
    let inbox = site.root.join("inbox");
    make_batches(&inbox);

    let sent = json(&ok(&site.send(&["--part-size", "1MiB", "--json", "-q"])));
    let batches = sent["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 3);
    assert!(
        batches
            .iter()
            .all(|b| b["failed"] == 0 && b["sent"] == b["files"]),
        "{sent:#}"
    );

    ok(&site.pull());
    let dest = site.root.join("dest/site-a");
    for batch in ["truck-7-run-1", "truck-7-run-2", "truck-9-run-1"] {
        let mut expected = tree(&inbox.join(batch));
        expected.remove(".ready");
        assert_eq!(tree(&dest.join(batch)), expected, "{batch}");
    }
    // Acknowledged: the relay holds nothing any more.
    assert!(
        site.relay_objects().is_empty(),
        "{:?}",
        site.relay_objects()
    );

    // Running both again moves nothing.
    let again = json(&ok(&site.send(&["--json", "-q"])));
    assert!(again["batches"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| b["sent"] == 0 && b["already_at_relay"] == b["files"]));
    let out = ok(&site.pull());
    assert!(out.contains("nothing waiting"), "{out}");

    // The catalogues: every batch sent and delivered, every file with both hashes.
    let edge: serde_json::Value = json(&site.status(&site.edge_catalog, &["--json"]));
    let core: serde_json::Value = json(&site.status(&site.core_catalog, &["--json"]));
    let of_role = |v: &serde_json::Value, role: &str| -> Vec<serde_json::Value> {
        v.as_array()
            .unwrap()
            .iter()
            .filter(|b| b["role"] == role)
            .cloned()
            .collect()
    };
    let (sent, delivered) = (of_role(&edge, "edge"), of_role(&core, "core"));
    assert_eq!(sent.len(), 3, "{edge:#}");
    assert_eq!(delivered.len(), 3, "{core:#}");
    assert!(sent.iter().all(|b| b["state"] == "sent"));
    assert!(delivered.iter().all(|b| b["state"] == "delivered"));
    for b in &delivered {
        for f in b["files"].as_array().unwrap() {
            assert_eq!(f["state"], "acknowledged", "{f:#}");
            assert_eq!(f["raw_sha256"].as_str().unwrap().len(), 64);
        }
    }
    // A file's lineage, from discovery at the edge to acknowledgement at the core.
    let text = site.status(
        &site.core_catalog,
        &["--file", "site-a/truck-7-run-1/bags/000.bag"],
    );
    assert!(
        text.contains("delivered to site-a/truck-7-run-1/bags/000.bag"),
        "{text}"
    );
    for state in ["delivered", "acknowledged", " UTC"] {
        assert!(text.contains(state), "{state} in {text}");
    }
    if site.edge_catalog == site.core_catalog {
        // One shared catalogue: the core's view of the file includes the edge's events.
        for state in ["discovered", "uploaded part 0", "sealed part 2"] {
            assert!(text.contains(state), "{state} in {text}");
        }
    }
    let text = site.status(&site.edge_catalog, &["--file", "bags/000.bag"]);
    for state in ["discovered", "uploaded part 0", "sealed part 2", "sealed"] {
        assert!(text.contains(state), "{state} in {text}");
    }
}

#[test]
fn a_part_damaged_at_the_relay_is_refused_reported_and_sent_again() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("run/big.bag"), &sample_bytes(4 << 20, 5));
    write(&inbox.join("run/.ready"), b"");
    ok(&site.send(&["--part-size", "1MiB", "-q"]));

    let victim = site
        .relay_objects()
        .into_iter()
        .find(|p| p.ends_with("part-000002.zst.age"))
        .unwrap();
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[1000] ^= 0x40;
    std::fs::write(&victim, bytes).unwrap();

    let err = fails(&site.pull());
    assert!(
        err.contains("big.bag")
            && err.contains("part 2")
            && err.contains("ciphertext SHA-256 mismatch"),
        "{err}"
    );
    assert!(err.contains("reported damaged to the relay"), "{err}");
    assert!(is_empty_dir(&site.root.join("dest")) || tree(&site.root.join("dest")).is_empty());
    assert!(!victim.exists(), "the relay dropped the damaged part");

    // The sender resumes: only the dropped part is uploaded again.
    let resent = json(&ok(&site.send(&["--part-size", "1MiB", "--json", "-q"])));
    let sealed = resent["batches"][0]["sealed_bytes"].as_u64().unwrap();
    assert!(
        sealed > 0 && sealed < 1 << 20,
        "only one sealed part (< 1 MiB) was sent again, not {sealed} bytes"
    );

    ok(&site.pull());
    assert_eq!(
        std::fs::read(site.root.join("dest/site-a/run/big.bag")).unwrap(),
        std::fs::read(inbox.join("run/big.bag")).unwrap()
    );
}

#[test]
fn a_batch_signed_by_an_untrusted_edge_is_not_delivered() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("run/file.bin"), b"payload");
    write(&inbox.join("run/.ready"), b"");
    let intruder = keygen(&site.root.join("intruder"));
    let mut send = args![
        "send",
        &inbox,
        "--recipient",
        &site.keys.core_pub,
        "--sign",
        &intruder.edge_key,
        "-q"
    ];
    send.extend(site.relay_args("edge.token"));
    ok(&send);
    let err = fails(&site.pull());
    assert!(err.contains("not among the trusted edge keys"), "{err}");
    assert!(!site.root.join("dest/site-a").exists());
    assert!(
        !site.relay_objects().is_empty(),
        "nothing is acknowledged, so the relay keeps it"
    );
}

#[test]
fn batches_wait_until_they_settle_or_are_marked_ready() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    write(&inbox.join("fresh/file.bin"), b"still being written");
    let out = ok(&site.send(&["--settle", "3600"]));
    assert!(out.contains("batch fresh: not ready"), "{out}");
    assert!(site.relay_objects().is_empty());
    let out = ok(&site.send(&["--settle", "0"]));
    assert!(out.contains("batch fresh: sent 1 of 1 files"), "{out}");
}
