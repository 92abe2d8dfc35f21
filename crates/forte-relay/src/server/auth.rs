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

/// A fresh token for `principal` (32 random bytes, in hex) and its `[[token]]` entry for the
/// tokens file, as `forte token` prints it.
pub fn new_entry(principal: &Principal) -> Result<(String, String)> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).context("reading the operating system's random source")?;
    let token = hex::encode(bytes);
    let quoted = |s: &str| toml::Value::String(s.to_owned()).to_string();
    let who = match principal {
        Principal::Edge { site } => format!("role = \"edge\"\nsite = {}", quoted(site)),
        Principal::Core { sites } => {
            let sites: Vec<String> = sites.iter().map(|s| quoted(s)).collect();
            format!("role = \"core\"\nsites = [{}]", sites.join(", "))
        }
    };
    let entry = format!("[[token]]\ntoken = {}\n{who}\n", quoted(&token));
    Ok((token, entry))
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
    role: TokenRole,
    site: Option<String>,
    #[serde(default)]
    sites: Vec<String>,
}

/// Who a token is for; a misspelt role fails when the file is read.
#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum TokenRole {
    Edge,
    Core,
}

/// One token of the table: its SHA-256 (the token itself is not kept), and whom it is for.
struct Known {
    digest: [u8; 32],
    principal: Principal,
}

/// The relay's token table.
pub struct Tokens {
    entries: Vec<Known>,
}

impl Tokens {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read tokens file {}", path.display()))?;
        let file: TokensFile = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("tokens file {} is not valid: {e}", path.display()))?;
        let mut entries: Vec<Known> = Vec::new();
        for (n, e) in file.token.into_iter().enumerate() {
            let at = format!("{}: token #{}", path.display(), n + 1);
            if e.token.len() < 16 {
                bail!("{at}: tokens must be at least 16 characters");
            }
            let principal = match (e.role, e.site, e.sites.is_empty()) {
                (TokenRole::Edge, Some(site), true) if valid_site(&site) => Principal::Edge { site },
                (TokenRole::Core, None, false) if e.sites.iter().all(|s| s == "*" || valid_site(s)) => {
                    Principal::Core { sites: e.sites }
                }
                _ => bail!(
                    "{at}: an edge token has role = \"edge\" and one site (letters, digits, . _ -); a core token has role = \"core\" and sites = [...]"
                ),
            };
            let token = digest(&e.token);
            // One token for two entries would make its holder whichever entry comes last.
            if let Some(first) = entries.iter().position(|known| known.digest == token) {
                bail!(
                    "{at} ({}) has the same token as token #{} ({}); give every [[token]] its own token",
                    describe(&principal),
                    first + 1,
                    describe(&entries[first].principal)
                );
            }
            entries.push(Known {
                digest: token,
                principal,
            });
        }
        if entries.is_empty() {
            bail!("tokens file {} defines no [[token]]", path.display());
        }
        Ok(Self { entries })
    }

    /// How many tokens it holds (never none: such a file is refused).
    pub fn count(&self) -> usize {
        self.entries.len()
    }

    /// The principal of a presented token, if any.
    pub fn lookup(&self, presented: &str) -> Option<Principal> {
        let presented = digest(presented);
        let mut found = None;
        for known in &self.entries {
            if bool::from(known.digest.ct_eq(&presented)) {
                found = Some(known.principal.clone());
            }
        }
        found
    }
}

/// A token entry by role and sites, never by its secret.
fn describe(principal: &Principal) -> String {
    match principal {
        Principal::Edge { site } => format!("edge of site {site}"),
        Principal::Core { sites } => format!("core of sites {}", sites.join(", ")),
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Tokens> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, text).unwrap();
        Tokens::load(&path)
    }

    /// What `forte token` prints is a tokens file the relay takes, and the token it made
    /// is the principal's, no one else's.
    #[test]
    fn a_new_entry_is_a_tokens_file_entry_for_its_principal() {
        let edge = Principal::Edge {
            site: "mine-7".into(),
        };
        let core = Principal::Core {
            sites: vec!["mine-7".into(), "*".into()],
        };
        let (edge_token, edge_entry) = new_entry(&edge).unwrap();
        let (core_token, core_entry) = new_entry(&core).unwrap();
        assert_eq!(edge_token.len(), 64);
        assert_ne!(edge_token, core_token);
        let tokens = load(&format!("{edge_entry}\n{core_entry}")).unwrap();
        assert_eq!(tokens.lookup(&edge_token), Some(edge));
        assert_eq!(tokens.lookup(&core_token), Some(core));
        assert_eq!(tokens.lookup(&edge_token[1..]), None);
    }

    const EDGE: &str =
        "[[token]]\ntoken = \"edge-token-0123456789\"\nrole = \"edge\"\nsite = \"site-a\"\n";
    const CORE: &str =
        "[[token]]\ntoken = \"core-token-0123456789\"\nrole = \"core\"\nsites = [\"*\"]\n";

    #[test]
    fn tokens_name_their_principal() {
        let tokens = load(&format!("{EDGE}{CORE}")).unwrap();
        assert_eq!(
            tokens.lookup("edge-token-0123456789"),
            Some(Principal::Edge {
                site: "site-a".into()
            })
        );
        assert!(tokens.lookup("core-token-0123456789").unwrap().pulls("b"));
        assert_eq!(tokens.lookup("edge-token-012345678"), None);
    }

    #[test]
    fn a_token_listed_twice_is_refused_without_printing_it() {
        // The core's token given again to an edge: that edge could pull every site.
        let twice = CORE.replace("core-token", "edge-token").replace(
            "role = \"core\"\nsites = [\"*\"]",
            "role = \"core\"\nsites = [\"site-a\", \"site-b\"]",
        );
        let e = load(&format!("{EDGE}{CORE}{twice}"))
            .err()
            .expect("a duplicate token is refused")
            .to_string();
        assert!(
            e.contains("token #3 (core of sites site-a, site-b) has the same token as token #1 (edge of site site-a)"),
            "{e}"
        );
        assert!(e.contains("tokens.toml"), "{e}");
        assert!(
            !e.contains("token-0123456789"),
            "the secret is printed: {e}"
        );
    }

    #[test]
    fn a_misspelt_role_is_refused_when_the_file_is_read() {
        let e = load(&EDGE.replace("role = \"edge\"", "role = \"egde\""))
            .err()
            .expect("an unknown role is refused")
            .to_string();
        assert!(
            e.contains("tokens.toml is not valid")
                && e.contains("unknown variant `egde`, expected `edge` or `core`"),
            "{e}"
        );
    }
}
