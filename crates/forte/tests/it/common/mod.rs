//! Helpers shared by the integration tests: run the real `forte` binary on real files.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

/// Command-line arguments of mixed types (strings, paths) as `OsString`s.
#[macro_export]
macro_rules! args {
    ($($a:expr),* $(,)?) => { vec![$(std::ffi::OsString::from($a)),*] };
}

pub type Args = Vec<std::ffi::OsString>;

/// The `forte` binary under test: this build's, or the one `FORTE_TEST_BINARY` names, to run
/// today's tests against another build (an earlier commit's, to see which tests catch what it
/// got wrong; docs/reliability.md).
pub fn forte() -> Command {
    Command::new(forte_binary())
}

/// The path of the `forte` binary under test (see [`forte`]), for scripts that run it.
pub fn forte_binary() -> std::ffi::OsString {
    std::env::var_os("FORTE_TEST_BINARY").unwrap_or_else(|| env!("CARGO_BIN_EXE_forte").into())
}

/// Runs forte with `args`, returning its output whatever the exit status.
pub fn run(args: &Args) -> Output {
    forte()
        .args(args)
        .output()
        .expect("running the forte binary")
}

/// Runs forte and fails the test with its stderr if it did not succeed.
pub fn ok(args: &Args) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "forte failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs forte, expects failure, returns stderr.
pub fn fails(args: &Args) -> String {
    let out = run(args);
    assert!(
        !out.status.success(),
        "forte unexpectedly succeeded:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(1), "exit code");
    String::from_utf8(out.stderr).unwrap()
}

/// A stock command-line tool the test needs. Missing tools fail the test (CI installs them:
/// see test.sh); they are never skipped.
pub fn tool(name: &str) -> Command {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "this test needs `{name}` on PATH (apt-get install {name}); ./test.sh installs it"
    );
    Command::new(name)
}

/// Runs a command, fails the test with its stderr unless it succeeds, and returns its stdout.
pub fn stdout_of(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

pub struct Keys {
    pub dir: PathBuf,
    pub core_key: PathBuf,
    pub core_pub: PathBuf,
    pub edge_key: PathBuf,
    pub edge_pub: PathBuf,
    pub receipt_key: PathBuf,
    pub receipt_pub: PathBuf,
}

pub fn keygen(dir: &Path) -> Keys {
    ok(&args!["keygen", "--dir", dir]);
    Keys {
        dir: dir.to_path_buf(),
        core_key: dir.join("core.key"),
        core_pub: dir.join("core.pub"),
        edge_key: dir.join("edge.key"),
        edge_pub: dir.join("edge.pub"),
        receipt_key: dir.join("receipt.key"),
        receipt_pub: dir.join("receipt.pub"),
    }
}

pub fn pack(keys: &Keys, src: &Path, to: &Path) -> String {
    pack_with(keys, src, to, &[])
}

/// [`pack`] with every file an object of its own, for tests that change one file's object.
pub fn pack_unbundled(keys: &Keys, src: &Path, to: &Path) -> String {
    pack_with(keys, src, to, &["--bundle-below", "0"])
}

fn pack_with(keys: &Keys, src: &Path, to: &Path, extra: &[&str]) -> String {
    let mut args = pack_args(keys, src, to);
    args.push("-q".into());
    args.extend(extra.iter().map(std::ffi::OsString::from));
    ok(&args)
}

/// `forte pack SRC --to TO` with the keys, for a test to add flags to.
pub fn pack_args(keys: &Keys, src: &Path, to: &Path) -> Args {
    args![
        "pack",
        src,
        "--to",
        to,
        "--recipient",
        &keys.core_pub,
        "--sign",
        &keys.edge_key
    ]
}

/// The edge's and the core's keys, to forge what only a compromised edge key could: correctly
/// signed manifests, inventories and bundles with wrong contents. Each test module adds the
/// forgeries it needs.
pub struct Forger {
    pub key: forte_format::EdgeKey,
    pub recipients: forte_format::Recipients,
    pub identities: forte_format::Identities,
    pub trusted: forte_format::TrustedEdges,
}

impl Forger {
    pub fn new(keys: &Keys) -> Self {
        Self {
            key: forte_format::EdgeKey::load(&keys.edge_key).unwrap(),
            recipients: forte_format::Recipients::load(&keys.core_pub).unwrap(),
            identities: forte_format::Identities::load(&keys.core_key).unwrap(),
            trusted: forte_format::TrustedEdges::load(&[forte_format::TrustSpec::any_site(
                &keys.edge_pub,
            )])
            .unwrap(),
        }
    }

    /// The plaintext of the age file at `sealed`.
    pub fn open(&self, sealed: &Path) -> Vec<u8> {
        let bytes = std::fs::read(sealed).unwrap();
        forte_format::seal::decrypt(&self.identities.0, &bytes, 1 << 30).unwrap()
    }

    /// `document` encrypted to the core.
    pub fn sealed(&self, document: &[u8]) -> Vec<u8> {
        let mut sealed = Vec::new();
        forte_format::seal::encrypt(&self.recipients.0, document, &mut sealed);
        sealed
    }

    /// `document` encrypted to the core, written to `to`.
    pub fn seal(&self, document: &[u8], to: &Path) {
        std::fs::write(to, self.sealed(document)).unwrap();
    }

    /// Re-signs the object's manifest after `edit`; the ciphertext of every part stays valid.
    pub fn rewrite_manifest(
        &self,
        object: &Path,
        edit: impl FnOnce(&mut forte_format::Manifest),
    ) -> forte_format::Manifest {
        let path = object.join(forte_format::MANIFEST_FILE);
        let mut manifest = forte_format::Manifest::open(&self.open(&path), &self.trusted).unwrap();
        edit(&mut manifest);
        self.seal(&manifest.sign(&self.key), &path);
        manifest
    }
}

pub fn unpack_args(keys: &Keys, dir: &Path, to: &Path) -> Args {
    args![
        "unpack",
        dir,
        "--to",
        to,
        "--identity",
        &keys.core_key,
        "--trust",
        &keys.edge_pub,
        "-q"
    ]
}

pub fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::File::create(path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
}

/// Incompressible bytes: on the wire and at the relay they take their own size.
pub fn random_bytes(len: u64) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .take(len)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// Deterministic, moderately compressible bytes.
pub fn sample_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let word = format!("{:08} sensor={} ", x % 100_000_000, x % 7);
        out.extend_from_slice(word.as_bytes());
    }
    out.truncate(len);
    out
}

/// Relative path → "sha256 mtime_ns mode" for files and "dir" for empty directories, computed
/// with streaming reads so gigabyte files do not need gigabytes of memory.
///
/// The tree may be live (a daemon delivering into it): an entry that vanishes between listing
/// and reading, such as a temporary file renamed into place, is skipped rather than fatal.
pub fn tree(root: &Path) -> BTreeMap<String, String> {
    fn gone<T>(result: std::io::Result<T>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!("walking a tree: {e}"),
        }
    }
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut empty = true;
        let Some(entries) = gone(std::fs::read_dir(dir)) else {
            return;
        };
        for entry in entries {
            let Some(entry) = gone(entry) else { continue };
            empty = false;
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let Some(meta) = gone(std::fs::symlink_metadata(&path)) else {
                continue;
            };
            if meta.is_dir() {
                walk(root, &path, out);
            } else {
                let Some(mut file) = gone(std::fs::File::open(&path)) else {
                    continue;
                };
                let mut hasher = Sha256::new();
                std::io::copy(&mut file, &mut hasher).unwrap();
                let mtime = meta
                    .modified()
                    .unwrap()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap();
                use std::os::unix::fs::PermissionsExt;
                out.insert(
                    rel,
                    format!(
                        "{} {} {:o}",
                        hex::encode(hasher.finalize()),
                        mtime.as_nanos(),
                        meta.permissions().mode() & 0o777
                    ),
                );
            }
        }
        if empty && dir != root {
            out.insert(
                dir.strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
                "dir".into(),
            );
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The object directories under a pack output, sorted.
pub fn objects(packed: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(packed)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Decrypts an object's manifest with the stock `age` tool and parses it.
pub fn manifest_json(keys: &Keys, object: &Path) -> serde_json::Value {
    let json = stdout_of(
        tool("age")
            .arg("-d")
            .arg("-i")
            .arg(&keys.core_key)
            .arg(object.join("manifest.age")),
    );
    serde_json::from_slice(&json).unwrap()
}

/// The object directory whose manifest has `path`.
pub fn object_for(keys: &Keys, packed: &Path, path: &str) -> PathBuf {
    objects(packed)
        .into_iter()
        .find(|o| manifest_json(keys, o)["path"] == path)
        .unwrap_or_else(|| panic!("no object for {path}"))
}

pub fn is_empty_dir(dir: &Path) -> bool {
    !dir.exists() || std::fs::read_dir(dir).unwrap().next().is_none()
}

/// Runs SQL on a SQLite catalogue with Python's sqlite3 (the catalogue's own API only moves
/// states forward, which is the point); returns the first column of the first row.
pub fn sqlite(catalog: &str, sql: &str) -> String {
    let script = "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\nr=c.execute(sys.argv[2]).fetchone()\nc.commit()\nprint(r[0] if r else '')";
    String::from_utf8(stdout_of(
        tool("python3").args(["-c", script, catalog, sql]),
    ))
    .unwrap()
    .trim()
    .to_string()
}

/// `args` with the value after `flag` replaced.
pub fn with(mut args: Args, flag: &str, value: impl Into<std::ffi::OsString>) -> Args {
    let i = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"));
    args[i + 1] = value.into();
    args
}

pub mod machine;
pub mod proxy;
pub mod site;

/// The tests' Python (`FORTE_TEST_PYTHON`, which test.sh sets, or `python3`) if it imports
/// `modules` (e.g. "pyarrow, duckdb"); in CI its absence fails the test, elsewhere it is skipped.
pub fn python_with(modules: &str) -> Option<PathBuf> {
    let candidate = std::env::var_os("FORTE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| "python3".into());
    let works = Command::new(&candidate)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if works {
        return Some(candidate);
    }
    assert!(
        std::env::var("CI").is_err(),
        "{} cannot import {modules}: CI must run this test (test.sh sets FORTE_TEST_PYTHON)",
        candidate.display()
    );
    eprintln!("SKIPPED: run ./test.sh, or set FORTE_TEST_PYTHON to a python with {modules}");
    None
}

/// Parses a command's JSON output, refusing what serde_json would quietly accept: a key
/// twice in one object (the later value would win, hiding the first from scripts) and
/// anything after the document other than whitespace.
pub fn strict_json(text: &str) -> serde_json::Value {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = <Strict as serde::Deserialize>::deserialize(&mut de)
        .unwrap_or_else(|e| panic!("not valid JSON ({e}):\n{text}"));
    de.end()
        .unwrap_or_else(|e| panic!("more than one JSON document ({e}):\n{text}"));
    value.0
}

struct Strict(serde_json::Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(items.into())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some((key, Strict(v))) = map.next_entry::<String, Strict>()? {
            if object.insert(key.clone(), v).is_some() {
                return Err(serde::de::Error::custom(format!(
                    "the key {key:?} twice in one object"
                )));
            }
        }
        Ok(object.into())
    }
}

/// Each line of a command's JSON-lines output, parsed strictly.
pub fn strict_json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(strict_json)
        .collect()
}
