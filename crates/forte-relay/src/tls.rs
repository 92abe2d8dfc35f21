//! TLS for the relay: its certificate (given, or self-signed on first start) and how clients
//! trust it (a CA file, or a pinned SHA-256 fingerprint of the relay's certificate).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, SignatureScheme};
use sha2::{Digest, Sha256};

/// The one crypto provider forte uses for TLS (ring: no C toolchain beyond what zstd needs).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes [`provider`] the process's default, for clients built by other crates (the S3
/// client of `object_store`) that take the default rather than one handed to them.
pub fn install_default_provider() {
    // Fails only when a default is installed already, which is then the one in use.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// SHA-256 of a certificate's DER bytes, lower-case hex: what `--relay-fingerprint` pins.
pub fn fingerprint(cert: &CertificateDer<'_>) -> String {
    hex::encode(Sha256::digest(cert.as_ref()))
}

/// The relay's certificate chain and key, and the fingerprint of its leaf.
pub struct ServerIdentity {
    pub config: rustls::ServerConfig,
    pub fingerprint: String,
    /// Where the certificate is, for clients that trust it as a CA file.
    pub cert_path: PathBuf,
}

/// Loads `cert` and `key` (PEM), or without them uses `dir/cert.pem` and `dir/key.pem`, creating
/// a self-signed pair for `names` there on first start.
pub fn server_identity(
    cert: Option<&Path>,
    key: Option<&Path>,
    dir: &Path,
    names: &[String],
) -> Result<ServerIdentity> {
    let (cert_path, key_path) = match (cert, key) {
        (Some(c), Some(k)) => (c.to_path_buf(), k.to_path_buf()),
        (None, None) => {
            let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
            if !c.exists() {
                generate_self_signed(&c, &k, names)?;
            }
            (c, k)
        }
        _ => bail!("give both --tls-cert and --tls-key, or neither for a self-signed pair"),
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
        .and_then(|certs| certs.collect())
        .with_context(|| format!("cannot read certificates from {}", cert_path.display()))?;
    let Some(leaf) = chain.first() else {
        bail!("{} holds no PEM certificate", cert_path.display());
    };
    let fingerprint = fingerprint(leaf);
    let key = PrivateKeyDer::from_pem_file(&key_path)
        .with_context(|| format!("cannot read the private key in {}", key_path.display()))?;
    let shown = format!("{} and {}", cert_path.display(), key_path.display());
    identity(chain, key, fingerprint, cert_path, &shown)
}

/// A self-signed certificate for `names` and its key, as one PEM text.
pub fn self_signed_pem(names: &[String]) -> Result<Vec<u8>> {
    let generated = rcgen::generate_simple_self_signed(names.to_vec())
        .context("generating a self-signed certificate")?;
    Ok(format!(
        "{}{}",
        generated.cert.pem(),
        generated.signing_key.serialize_pem()
    )
    .into_bytes())
}

/// The identity in `pem` (certificates and a key, as [`self_signed_pem`] makes them); the
/// certificate is also written to a file of the temporary directory, for clients that trust it
/// as a CA file.
pub fn identity_from_pem(pem: &[u8]) -> Result<ServerIdentity> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<_, _>>()
        .context("cannot read the certificate kept in the store")?;
    let key = PrivateKeyDer::from_pem_slice(pem)
        .context("cannot read the private key kept in the store")?;
    let Some(leaf) = chain.first() else {
        bail!("the identity kept in the store holds no certificate");
    };
    let fingerprint = fingerprint(leaf);
    let cert_path = std::env::temp_dir().join(format!("forte-relay-{}.pem", &fingerprint[..16]));
    // The certificate blocks of the text, without the key.
    let mut cert_pem = String::new();
    let mut inside = false;
    for line in String::from_utf8_lossy(pem).lines() {
        inside |= line == "-----BEGIN CERTIFICATE-----";
        if inside {
            cert_pem.push_str(line);
            cert_pem.push('\n');
        }
        inside &= line != "-----END CERTIFICATE-----";
    }
    std::fs::write(&cert_path, cert_pem)
        .with_context(|| format!("cannot write {}", cert_path.display()))?;
    identity(
        chain,
        key,
        fingerprint,
        cert_path,
        "the identity kept in the store",
    )
}

/// The server configuration for `chain` (its leaf's `fingerprint` given, the certificate at
/// `cert_path`) and `key`; `shown` names where they came from, for the error.
fn identity(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    fingerprint: String,
    cert_path: PathBuf,
    shown: &str,
) -> Result<ServerIdentity> {
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .with_context(|| format!("{shown} do not form a usable pair"))?;
    Ok(ServerIdentity {
        config,
        fingerprint,
        cert_path,
    })
}

fn generate_self_signed(cert: &Path, key: &Path, names: &[String]) -> Result<()> {
    let generated = rcgen::generate_simple_self_signed(names.to_vec())
        .context("generating a self-signed certificate")?;
    if let Some(dir) = cert.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let write = |path: &Path, mode: u32, text: String| -> Result<()> {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
            .with_context(|| format!("cannot write {}", path.display()))
    };
    write(key, 0o600, generated.signing_key.serialize_pem())?;
    write(cert, 0o644, generated.cert.pem())
}

/// How a client decides the relay is the relay.
#[derive(Debug, Clone)]
pub enum RelayTrust {
    /// The relay's certificate must have this SHA-256 fingerprint (hex, `:` allowed).
    Fingerprint(String),
    /// The relay's certificate must chain to a certificate in this PEM file.
    CaFile(PathBuf),
}

/// A rustls client configuration that trusts the relay as `trust` says.
pub fn client_config(trust: &RelayTrust) -> Result<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let config = match trust {
        RelayTrust::Fingerprint(pin) => {
            let cleaned: String = pin
                .chars()
                .filter(|c| *c != ':')
                .collect::<String>()
                .to_lowercase();
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(&cleaned, &mut bytes).map_err(|_| {
                anyhow::anyhow!(
                    "relay fingerprint {pin:?} is not 64 hex digits (the relay prints it at start)"
                )
            })?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedCertificate {
                    sha256: bytes,
                    provider: provider(),
                }))
                .with_no_client_auth()
        }
        RelayTrust::CaFile(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(path)
                .with_context(|| format!("cannot read CA file {}", path.display()))?
            {
                let cert = cert.with_context(|| format!("bad PEM in {}", path.display()))?;
                roots
                    .add(cert)
                    .with_context(|| format!("unusable certificate in {}", path.display()))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    Ok(config)
}

/// The relay presented a certificate other than the pinned one: the pin is wrong (or the relay
/// got a new certificate), and trying again cannot help.
#[derive(Debug, thiserror::Error)]
#[error("relay certificate fingerprint {found} is not the pinned {pinned}")]
pub struct FingerprintMismatch {
    /// The fingerprint of the certificate the relay presented.
    pub found: String,
    /// The fingerprint the client was told to expect (`--relay-fingerprint`).
    pub pinned: String,
}

/// Accepts exactly one certificate, named by its SHA-256, and checks the handshake was signed
/// by its key. Host names do not matter: the pin is stronger than any name.
#[derive(Debug)]
struct PinnedCertificate {
    sha256: [u8; 32],
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let found: [u8; 32] = Sha256::digest(end_entity.as_ref()).into();
        if found == self.sha256 {
            Ok(ServerCertVerified::assertion())
        } else {
            // A certificate error (not `General`), so that the client sees it as one: no retry
            // makes another certificate match.
            Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                OtherError(Arc::new(FingerprintMismatch {
                    found: hex::encode(found),
                    pinned: hex::encode(self.sha256),
                })),
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
