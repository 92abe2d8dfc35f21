//! Key files: the core's age identity and recipient, the edge's Ed25519 signing key, and the
//! set of edge keys the core trusts.
//!
//! | file       | holds                                         | format                         |
//! |------------|-----------------------------------------------|--------------------------------|
//! | `core.key` | age X25519 identity (decrypts)                | as written by `age-keygen`     |
//! | `core.pub` | age X25519 recipient (encrypts)               | one `age1…` line               |
//! | `edge.key` | Ed25519 signing key (signs manifests)         | PKCS#8 PEM (`openssl pkey`)    |
//! | `edge.pub` | Ed25519 verifying key (trusted by the core)   | SubjectPublicKeyInfo PEM       |
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

/// The edge's signing key.
pub struct EdgeKey(pub SigningKey);

/// Edge keys whose signatures the core accepts.
#[derive(Clone, Default)]
pub struct TrustedEdges(pub Vec<VerifyingKey>);

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
}

impl KeyPaths {
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            core_key: dir.join("core.key"),
            core_pub: dir.join("core.pub"),
            edge_key: dir.join("edge.key"),
            edge_pub: dir.join("edge.pub"),
        }
    }
}

/// Writes a fresh core key pair and edge key pair into `dir`. Secret files get mode 0600.
/// Refuses to overwrite any existing key file, and writes nothing if one exists.
pub fn generate(dir: &Path) -> Result<KeyPaths> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating key directory {}", dir.display()))?;
    let paths = KeyPaths::in_dir(dir);
    for p in [
        &paths.core_key,
        &paths.core_pub,
        &paths.edge_key,
        &paths.edge_pub,
    ] {
        if p.exists() {
            bail!(
                "{} already exists; keygen never overwrites keys (move the old ones away or choose another --dir)",
                p.display()
            );
        }
    }
    let core = x25519::Identity::generate();
    let core_pub = core.to_public().to_string();
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed).context("reading the operating system's random source")?;
    let edge = SigningKey::from_bytes(&seed);
    let line_ending = ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF;

    write_new(
        &paths.core_key,
        0o600,
        format!(
            "# forte core identity (age X25519); keep secret\n# public key: {core_pub}\n{}\n",
            core.to_string().expose_secret()
        )
        .as_bytes(),
    )?;
    write_new(&paths.core_pub, 0o644, format!("{core_pub}\n").as_bytes())?;
    // PKCS#8 v1 (RFC 8410, no embedded public key): the form OpenSSL 3.0 reads.
    let edge_pem = ed25519_dalek::pkcs8::KeypairBytes {
        secret_key: seed,
        public_key: None,
    }
    .to_pkcs8_pem(line_ending)
    .context("encoding the edge key")?;
    write_new(&paths.edge_key, 0o600, edge_pem.as_bytes())?;
    let edge_pub = edge
        .verifying_key()
        .to_public_key_pem(line_ending)
        .context("encoding the edge public key")?;
    write_new(&paths.edge_pub, 0o644, edge_pub.as_bytes())?;
    Ok(paths)
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

impl TrustedEdges {
    /// Reads Ed25519 public keys in SubjectPublicKeyInfo PEM, one or more per file.
    pub fn load(paths: &[PathBuf]) -> Result<Self> {
        let mut keys = Vec::new();
        for path in paths {
            let text = read_text(path, "trusted edge key")?;
            let before = keys.len();
            for block in text.split_inclusive("-----END PUBLIC KEY-----") {
                let block = block.trim();
                if !block.contains("-----BEGIN PUBLIC KEY-----") {
                    continue;
                }
                let key = VerifyingKey::from_public_key_pem(block).map_err(|e| {
                    anyhow::anyhow!(
                        "{}: not an Ed25519 public key in PEM ({e}); use edge.pub from `forte keygen`",
                        path.display()
                    )
                })?;
                keys.push(key);
            }
            if keys.len() == before {
                bail!(
                    "{}: no PEM public key found; use edge.pub from `forte keygen`",
                    path.display()
                );
            }
        }
        Ok(Self(keys))
    }

    pub fn trusts(&self, key: &VerifyingKey) -> bool {
        self.0.iter().any(|k| k == key)
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
        let trusted = TrustedEdges::load(std::slice::from_ref(&paths.edge_pub)).unwrap();
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
        TrustedEdges::load(std::slice::from_ref(&paths.edge_pub)).unwrap();
    }
}
