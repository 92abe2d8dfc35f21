//! Key files: the core's age identity and recipient, the edge's Ed25519 signing key, and the
//! set of edge keys the core trusts.
//!
//! | file       | holds                                         | format                         |
//! |------------|-----------------------------------------------|--------------------------------|
//! | `core.key` | age X25519 identity (decrypts)                | as written by `age-keygen`     |
//! | `core.pub` | age X25519 recipient (encrypts)               | one `age1…` line               |
//! | `edge.key` | Ed25519 signing key (signs manifests)         | PKCS#8 PEM (`openssl pkey`)    |
//! | `edge.pub` | Ed25519 verifying key (trusted by the core)   | SubjectPublicKeyInfo PEM       |
//! | `receipt.key` | Ed25519 signing key of the core (signs custody receipts) | PKCS#8 PEM |
//! | `receipt.pub` | its verifying key (the edge checks receipts with it) | SubjectPublicKeyInfo PEM |
//!
//! All are standard formats, so `age` and `openssl` read them without forte.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use age::secrecy::ExposeSecret;
use age::x25519;
use anyhow::{bail, Context, Result};
use base64::Engine;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{SigningKey, VerifyingKey};

/// The age recipients every part and manifest is encrypted to.
#[derive(Clone)]
pub struct Recipients(pub Vec<x25519::Recipient>);

/// The age identities the core decrypts with.
pub struct Identities(pub Vec<x25519::Identity>);

/// An Ed25519 signing key: the edge's (manifests, inventories) or the core's (custody
/// receipts). The same file format serves both.
pub struct EdgeKey(pub SigningKey);

/// The core's key that signs custody receipts (`receipt.key`).
pub type ReceiptKey = EdgeKey;

/// Edge keys whose signatures the core accepts, and the sites each may sign for. A key given
/// without a site (`--trust edge.pub`) may sign for any site; one bound to sites
/// (`--trust mine-7=edge.pub`) only for those, so that a relay cannot file one site's batch
/// under another site even when both sites share a key.
#[derive(Clone, Default, Debug)]
pub struct TrustedEdges {
    keys: Vec<VerifyingKey>,
    /// The sites each bound key may sign for; a key absent here may sign for any site.
    sites: std::collections::HashMap<[u8; 32], std::collections::BTreeSet<String>>,
}

/// One `--trust` value: an edge public key file, optionally bound to the site it signs for
/// (`SITE=FILE`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct TrustSpec {
    pub site: Option<String>,
    pub path: PathBuf,
}

impl TrustSpec {
    /// A key file whose keys may sign for any site.
    pub fn any_site(path: &Path) -> Self {
        Self {
            site: None,
            path: path.to_path_buf(),
        }
    }
}

impl TryFrom<String> for TrustSpec {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl FromStr for TrustSpec {
    type Err = String;

    /// `FILE`, or `SITE=FILE` where SITE is a site name as the relay's tokens.toml gives it.
    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once('=') {
            Some((site, path)) if !site.contains('/') => {
                check_site_name(site)?;
                if path.is_empty() {
                    return Err(format!("{text:?}: no key file after {site}="));
                }
                Ok(Self {
                    site: Some(site.to_string()),
                    path: PathBuf::from(path),
                })
            }
            _ => Ok(Self {
                site: None,
                path: PathBuf::from(text),
            }),
        }
    }
}

/// A site's name, as the relay's tokens.toml and the edge's `--site` give it: 1 to 64 letters,
/// digits, `.`, `_` or `-`, not starting with `.`. Signed into every inventory, so it is kept
/// to characters that need no escaping anywhere (paths, JSON, logs).
pub fn check_site_name(site: &str) -> Result<(), String> {
    let ok = !site.is_empty()
        && site.len() <= 64
        && !site.starts_with('.')
        && site
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{site:?} is not a site name (1 to 64 letters, digits, '.', '_' or '-', not starting with '.')"
        ))
    }
}

/// Core receipt keys whose signatures the edge accepts (`receipt.pub`).
#[derive(Clone, Default, Debug)]
pub struct TrustedCores(pub Vec<VerifyingKey>);

/// The printable form of an Ed25519 public key used in manifests and messages: standard base64
/// of its 32 bytes.
pub fn edge_key_id(key: &VerifyingKey) -> String {
    base64::engine::general_purpose::STANDARD.encode(key.as_bytes())
}

/// The paths `keygen` writes into `dir`.
pub struct KeyPaths {
    pub core_key: PathBuf,
    pub core_pub: PathBuf,
    pub edge_key: PathBuf,
    pub edge_pub: PathBuf,
    pub receipt_key: PathBuf,
    pub receipt_pub: PathBuf,
}

impl KeyPaths {
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            core_key: dir.join("core.key"),
            core_pub: dir.join("core.pub"),
            edge_key: dir.join("edge.key"),
            edge_pub: dir.join("edge.pub"),
            receipt_key: dir.join("receipt.key"),
            receipt_pub: dir.join("receipt.pub"),
        }
    }
}

/// Writes a fresh core key pair, edge key pair and core receipt-signing key pair into `dir`
/// (`KeySet::All`), as the demo and the tests use them.
pub fn generate(dir: &Path) -> Result<KeyPaths> {
    generate_set(dir, &KeySet::All)?;
    Ok(KeyPaths::in_dir(dir))
}

/// Which keys `generate_set` makes: the core's (its age pair and its receipt-signing pair), one
/// edge's signing pair (named after its site), or both sets for one machine (the demo's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySet {
    Core,
    Edge { site: String },
    All,
}

/// The files `generate_set` wrote.
#[derive(Debug, Default)]
pub struct Generated {
    /// The core's age identity and recipient files.
    pub core: Option<(PathBuf, PathBuf)>,
    /// The core's receipt-signing key and its public key.
    pub receipt: Option<(PathBuf, PathBuf)>,
    /// An edge's signing key and its public key.
    pub edge: Option<(PathBuf, PathBuf)>,
}

/// Writes fresh key pairs of `set` into `dir`: core.key/core.pub and receipt.key/receipt.pub
/// for the core, SITE.key/SITE.pub for an edge (edge.key/edge.pub with `All`). Secret files
/// get mode 0600. Refuses to overwrite any existing key file, and writes nothing if one
/// exists.
pub fn generate_set(dir: &Path, set: &KeySet) -> Result<Generated> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating key directory {}", dir.display()))?;
    let pair = |name: &str| {
        (
            dir.join(format!("{name}.key")),
            dir.join(format!("{name}.pub")),
        )
    };
    let core = matches!(set, KeySet::Core | KeySet::All);
    let planned = Generated {
        core: core.then(|| pair("core")),
        receipt: core.then(|| pair("receipt")),
        edge: match set {
            KeySet::Core => None,
            KeySet::Edge { site } => Some(pair(site)),
            KeySet::All => Some(pair("edge")),
        },
    };
    let files = [&planned.core, &planned.receipt, &planned.edge];
    for (secret, public) in files.into_iter().flatten() {
        if let Some(p) = [secret, public].into_iter().find(|p| p.exists()) {
            bail!(
                "{} already exists; keygen never overwrites keys (move the old ones away or choose another --dir)",
                p.display()
            );
        }
    }
    let line_ending = ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF;
    if let Some((key, public)) = &planned.core {
        let core = x25519::Identity::generate();
        let core_pub = core.to_public().to_string();
        write_new(
            key,
            0o600,
            format!(
                "# forte core identity (age X25519); keep secret\n# public key: {core_pub}\n{}\n",
                core.to_string().expose_secret()
            )
            .as_bytes(),
        )?;
        write_new(public, 0o644, format!("{core_pub}\n").as_bytes())?;
    }
    for (secret, public) in [&planned.edge, &planned.receipt].into_iter().flatten() {
        write_signing_pair(secret, public, line_ending)?;
    }
    Ok(planned)
}

/// A fresh Ed25519 key pair: the secret in PKCS#8 v1 PEM (RFC 8410, no embedded public key:
/// the form OpenSSL 3.0 reads), the public key in SubjectPublicKeyInfo PEM.
fn write_signing_pair(
    secret: &Path,
    public: &Path,
    line_ending: ed25519_dalek::pkcs8::spki::der::pem::LineEnding,
) -> Result<()> {
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed).context("reading the operating system's random source")?;
    let key = SigningKey::from_bytes(&seed);
    let pem = ed25519_dalek::pkcs8::KeypairBytes {
        secret_key: seed,
        public_key: None,
    }
    .to_pkcs8_pem(line_ending)
    .context("encoding a signing key")?;
    write_new(secret, 0o600, pem.as_bytes())?;
    let public_pem = key
        .verifying_key()
        .to_public_key_pem(line_ending)
        .context("encoding a public key")?;
    write_new(public, 0o644, public_pem.as_bytes())
}

fn write_new(path: &Path, mode: u32, contents: &[u8]) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// Refuses a secret key file that group or others may access, as ssh does: anyone who can
/// read it can decrypt (core.key) or sign as this edge (edge.key). Public keys are not checked.
fn check_secret_mode(path: &Path) -> Result<()> {
    // A file that cannot be read is reported by the read that follows, with its reason.
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "secret key file {} has mode {mode:04o}: group or others may read it; refusing to use it (fix: chmod 600 {})",
            path.display(),
            path.display()
        );
    }
    Ok(())
}

fn read_text(path: &Path, what: &str) -> Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {what} file {}", path.display()))
}

/// Lines that carry a key: not blank, not a `#` comment.
fn key_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
}

/// Parses every key line of `path` with `T::from_str`; `what` and `expected` word the errors.
fn load_key_lines<T: FromStr>(path: &Path, what: &str, expected: &str) -> Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    let text = read_text(path, what)?;
    let keys = key_lines(&text)
        .map(|(n, line)| {
            T::from_str(line).map_err(|e| {
                anyhow::anyhow!(
                    "{}:{n}: not an {what} ({e}); expected {expected}",
                    path.display()
                )
            })
        })
        .collect::<Result<Vec<T>>>()?;
    if keys.is_empty() {
        bail!("{}: no {what} found; expected {expected}", path.display());
    }
    Ok(keys)
}

impl Recipients {
    /// Reads an age recipients file: one `age1…` recipient per line, `#` comments allowed.
    pub fn load(path: &Path) -> Result<Self> {
        load_key_lines(
            path,
            "age X25519 recipient",
            "a line starting with age1, as in core.pub from `forte keygen`",
        )
        .map(Self)
    }
}

/// Every key of every file of `paths`, in order.
fn keys_of_all<K>(paths: &[PathBuf], load: impl Fn(&Path) -> Result<Vec<K>>) -> Result<Vec<K>> {
    let mut all = Vec::new();
    for path in paths {
        all.extend(load(path)?);
    }
    Ok(all)
}

impl Recipients {
    /// Every recipient of every file, in order: several files (or several lines of one) encrypt
    /// to each key, as while a core's key is being rotated.
    pub fn load_all(paths: &[PathBuf]) -> Result<Self> {
        keys_of_all(paths, |path| Ok(Self::load(path)?.0)).map(Self)
    }
}

impl Identities {
    /// Every identity of every file: a core decrypts with whichever one a batch was sealed to.
    pub fn load_all(paths: &[PathBuf]) -> Result<Self> {
        keys_of_all(paths, |path| Ok(Self::load(path)?.0)).map(Self)
    }
}

impl Identities {
    /// Reads an age identity file as written by `age-keygen` or `forte keygen`. Refuses a file
    /// that group or others may access (fix: `chmod 600`).
    pub fn load(path: &Path) -> Result<Self> {
        check_secret_mode(path)?;
        load_key_lines(
            path,
            "age X25519 identity",
            "a line starting with AGE-SECRET-KEY-1, as in core.key from `forte keygen`",
        )
        .map(Self)
    }
}

impl EdgeKey {
    /// Reads an Ed25519 private key in PKCS#8 PEM. Refuses a file that group or others may
    /// access (fix: `chmod 600`).
    pub fn load(path: &Path) -> Result<Self> {
        check_secret_mode(path)?;
        let text = read_text(path, "signing key")?;
        let key = SigningKey::from_pkcs8_pem(&text).map_err(|e| {
            anyhow::anyhow!(
                "{}: not an Ed25519 private key in PKCS#8 PEM ({e}); use edge.key from `forte keygen`",
                path.display()
            )
        })?;
        Ok(Self(key))
    }
}

/// Every Ed25519 public key (SubjectPublicKeyInfo PEM) in `path`, one or more; `what` names
/// the file in errors ("edge.pub", "receipt.pub").
fn load_public_keys(path: &Path, what: &str) -> Result<Vec<VerifyingKey>> {
    let text = read_text(path, &format!("trusted key ({what})"))?;
    let mut keys = Vec::new();
    for block in text.split_inclusive("-----END PUBLIC KEY-----") {
        let block = block.trim();
        if !block.contains("-----BEGIN PUBLIC KEY-----") {
            continue;
        }
        let key = VerifyingKey::from_public_key_pem(block).map_err(|e| {
            anyhow::anyhow!(
                "{}: not an Ed25519 public key in PEM ({e}); use {what} from `forte keygen`",
                path.display()
            )
        })?;
        keys.push(key);
    }
    if keys.is_empty() {
        bail!(
            "{}: no PEM public key found; use {what} from `forte keygen`",
            path.display()
        );
    }
    Ok(keys)
}

impl TrustedEdges {
    /// Keys that may sign for any site.
    pub fn any_site(keys: Vec<VerifyingKey>) -> Self {
        Self {
            keys,
            sites: Default::default(),
        }
    }

    /// Reads Ed25519 public keys in SubjectPublicKeyInfo PEM, one or more per file, each bound
    /// to the site its spec names or to none. A key given once without a site may sign for
    /// any site, whatever other specs bind it to.
    pub fn load(specs: &[TrustSpec]) -> Result<Self> {
        let mut trusted = Self::default();
        let mut unbound = std::collections::HashSet::new();
        for spec in specs {
            for key in load_public_keys(&spec.path, "edge.pub")? {
                if !trusted.keys.contains(&key) {
                    trusted.keys.push(key);
                }
                match &spec.site {
                    None => {
                        unbound.insert(key.to_bytes());
                    }
                    Some(site) => {
                        let sites = trusted.sites.entry(key.to_bytes()).or_default();
                        sites.insert(site.clone());
                    }
                }
            }
        }
        for key in unbound {
            trusted.sites.remove(&key);
        }
        Ok(trusted)
    }

    /// Keys given without a site, which may sign for any site: worth a warning where sites
    /// send to one core.
    pub fn unbound(&self) -> Vec<String> {
        self.keys
            .iter()
            .filter(|k| !self.sites.contains_key(&k.to_bytes()))
            .map(edge_key_id)
            .collect()
    }

    pub fn trusts(&self, key: &VerifyingKey) -> bool {
        self.keys.contains(key)
    }

    /// How many keys are trusted.
    pub fn count(&self) -> usize {
        self.keys.len()
    }

    /// Whether `key` is trusted and may sign for `site`.
    pub fn may_sign_for(&self, key: &VerifyingKey, site: &str) -> bool {
        self.trusts(key)
            && self
                .sites
                .get(&key.to_bytes())
                .is_none_or(|sites| sites.contains(site))
    }
}

impl TrustedCores {
    /// Reads the core's receipt keys (receipt.pub), one or more per file.
    pub fn load(paths: &[PathBuf]) -> Result<Self> {
        let mut keys = Vec::new();
        for path in paths {
            keys.extend(load_public_keys(path, "receipt.pub")?);
        }
        Ok(Self(keys))
    }

    pub fn trusts(&self, key: &VerifyingKey) -> bool {
        self.0.contains(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_load_back_with_private_modes() {
        let dir = tempfile::tempdir().unwrap();
        let paths = generate(dir.path()).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&paths.core_key), 0o600);
        assert_eq!(mode(&paths.edge_key), 0o600);
        let ids = Identities::load(&paths.core_key).unwrap();
        let rs = Recipients::load(&paths.core_pub).unwrap();
        assert_eq!(ids.0[0].to_public().to_string(), rs.0[0].to_string());
        let edge = EdgeKey::load(&paths.edge_key).unwrap();
        let trusted = TrustedEdges::load(&[TrustSpec::any_site(&paths.edge_pub)]).unwrap();
        assert!(trusted.trusts(&edge.0.verifying_key()));

        let again = generate(dir.path()).err().unwrap().to_string();
        assert!(again.contains("already exists"), "{again}");
    }

    #[test]
    fn wrong_files_name_the_file_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let bogus = dir.path().join("bogus.pub");
        std::fs::write(&bogus, "hello\n").unwrap();
        // Private, so that EdgeKey::load gets as far as parsing it.
        std::fs::set_permissions(&bogus, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = Recipients::load(&bogus).err().unwrap().to_string();
        assert!(e.contains("bogus.pub:1") && e.contains("age1"), "{e}");
        let e = EdgeKey::load(&bogus).err().unwrap().to_string();
        assert!(e.contains("bogus.pub") && e.contains("PKCS#8"), "{e}");
        let e = Identities::load(&dir.path().join("missing.key"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("missing.key"), "{e}");
    }

    #[test]
    fn secret_keys_open_to_group_or_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let paths = generate(dir.path()).unwrap();
        let chmod = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        for mode in [0o644, 0o640, 0o604, 0o620] {
            chmod(&paths.core_key, mode);
            chmod(&paths.edge_key, mode);
            for e in [
                Identities::load(&paths.core_key).err(),
                EdgeKey::load(&paths.edge_key).err(),
            ] {
                let e = e.expect("an open secret key is refused").to_string();
                let file = if e.contains("core.key") {
                    &paths.core_key
                } else {
                    &paths.edge_key
                };
                assert!(
                    e.contains(&format!("mode {mode:04o}"))
                        && e.contains(&format!("chmod 600 {}", file.display())),
                    "{e}"
                );
            }
        }
        // Owner-only modes are fine, and public keys are read at any mode.
        chmod(&paths.core_key, 0o400);
        chmod(&paths.edge_key, 0o600);
        chmod(&paths.core_pub, 0o644);
        chmod(&paths.edge_pub, 0o666);
        Identities::load(&paths.core_key).unwrap();
        EdgeKey::load(&paths.edge_key).unwrap();
        Recipients::load(&paths.core_pub).unwrap();
        TrustedEdges::load(&[TrustSpec::any_site(&paths.edge_pub)]).unwrap();
    }
}
