//! Bearer tokens: who is asking, and which site's objects they may touch.
//!
//! ```toml
//! [[token]]              # an edge: uploads for one site
//! token = "…"
//! site = "site-a"
//! role = "edge"
//!
//! [[token]]              # the core: pulls the listed sites ("*" for all)
//! token = "…"
//! role = "core"
//! sites = ["site-a", "site-b"]
//! ```
//!
//! Tokens are kept only as SHA-256 digests and compared in constant time, every entry every
//! time, so neither timing nor an early exit tells an attacker how close a guess was.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::api::valid_site;

/// Who a valid token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Edge { site: String },
    Core { sites: Vec<String> },
}

impl Principal {
    /// Whether this principal may pull `site`'s objects.
    pub fn pulls(&self, site: &str) -> bool {
        match self {
            Principal::Core { sites } => sites.iter().any(|s| s == "*" || s == site),
            Principal::Edge { .. } => false,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    token: String,
    role: String,
    site: Option<String>,
    #[serde(default)]
    sites: Vec<String>,
}

/// The relay's token table.
pub struct Tokens {
    entries: Vec<([u8; 32], Principal)>,
}

impl Tokens {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read tokens file {}", path.display()))?;
        let file: TokensFile = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("tokens file {} is not valid: {e}", path.display()))?;
        let mut entries = Vec::new();
        for (n, e) in file.token.into_iter().enumerate() {
            let at = format!("{}: token #{}", path.display(), n + 1);
            if e.token.len() < 16 {
                bail!("{at}: tokens must be at least 16 characters");
            }
            let principal = match (e.role.as_str(), e.site, e.sites.is_empty()) {
                ("edge", Some(site), true) if valid_site(&site) => Principal::Edge { site },
                ("core", None, false) if e.sites.iter().all(|s| s == "*" || valid_site(s)) => {
                    Principal::Core { sites: e.sites }
                }
                _ => bail!(
                    "{at}: an edge token has role = \"edge\" and one site (letters, digits, . _ -); a core token has role = \"core\" and sites = [...]"
                ),
            };
            entries.push((digest(&e.token), principal));
        }
        if entries.is_empty() {
            bail!("tokens file {} defines no [[token]]", path.display());
        }
        Ok(Self { entries })
    }

    /// The principal of a presented token, if any.
    pub fn lookup(&self, presented: &str) -> Option<Principal> {
        let presented = digest(presented);
        let mut found = None;
        for (known, principal) in &self.entries {
            if bool::from(known.ct_eq(&presented)) {
                found = Some(principal.clone());
            }
        }
        found
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}
