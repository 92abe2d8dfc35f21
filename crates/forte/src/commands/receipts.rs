//! `forte receipts`: the core's custody receipts a catalogue holds (signed at the core, or
//! verified and kept at the edge), or receipt files given by an auditor, each verified with the
//! core's receipt key; printed, or exported as JSON.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use forte_catalog::format_utc;
use forte_format::Receipt;
use serde::Serialize;

use forte_daemon::record::Catalog;
use forte_daemon::settings::{self, Config};

#[derive(clap::Args)]
pub struct Args {
    /// The core's receipt key to verify with (receipt.pub); repeat for several cores
    /// [config: keys.receipt_pub]. Without it receipts are printed unverified, and said so.
    #[arg(long, value_name = "FILE")]
    receipt_pub: Vec<PathBuf>,
    /// Verify these receipt files (JSON as signed) instead of the catalogue's [per run].
    #[arg(value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Print each receipt as JSON (one document per line, the signed receipt under `receipt`) [per run].
    #[arg(long)]
    json: bool,
}

/// One receipt with what checking it said.
#[derive(Serialize)]
struct Checked {
    /// Where it came from: the catalogue, or the file's path.
    source: String,
    /// Whether its signature verified with a trusted core key; `null` when none was given.
    verified: Option<bool>,
    /// Why it did not verify.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// The signed receipt, as signed.
    receipt: serde_json::Value,
}

pub fn run(args: Args, config: &Config, catalog: impl FnOnce() -> Result<Catalog>) -> Result<bool> {
    let trusted = settings::receipt_pub(&args.receipt_pub, config)?;
    let documents: Vec<(String, Vec<u8>)> = if args.files.is_empty() {
        let catalog = catalog()?;
        let rows = catalog.receipts()?;
        rows.into_iter()
            .filter_map(|r| {
                let source = format!("catalogue ({}, batch {})", r.role, r.batch_key);
                r.receipt.map(|text| (source, text.into_bytes()))
            })
            .collect()
    } else {
        args.files
            .iter()
            .map(|path| {
                let bytes = std::fs::read(path)
                    .with_context(|| format!("cannot read receipt {}", path.display()))?;
                Ok((path.display().to_string(), bytes))
            })
            .collect::<Result<_>>()?
    };
    let mut all_verified = true;
    for (source, document) in documents {
        let (verified, error) = match &trusted {
            Some(trusted) => match Receipt::open(&document, trusted) {
                Ok(_) => (Some(true), None),
                Err(e) => (Some(false), Some(format!("receipt {e}"))),
            },
            None => (None, None),
        };
        all_verified &= verified != Some(false);
        let receipt: serde_json::Value = match serde_json::from_slice(&document) {
            Ok(value) => value,
            Err(e) => {
                all_verified = false;
                tracing::warn!("{source}: not a receipt ({e})");
                continue;
            }
        };
        let checked = Checked {
            source,
            verified,
            error,
            receipt,
        };
        if args.json {
            println!("{}", serde_json::to_string(&checked)?);
        } else {
            print_text(&checked);
        }
    }
    if trusted.is_none() && !args.json {
        tracing::warn!(
            "not verified: give --receipt-pub keys/receipt.pub to check the core's signatures"
        );
    }
    if !all_verified && trusted.is_some() {
        bail!("some receipts do not verify with the given core keys (see above)");
    }
    Ok(true)
}

fn print_text(c: &Checked) {
    let r = &c.receipt;
    let text = |key: &str| r[key].as_str().unwrap_or("?").to_string();
    let verdict = match (c.verified, &c.error) {
        (Some(true), _) => "verified".to_string(),
        (Some(false), Some(e)) => format!("DOES NOT VERIFY: {e}"),
        _ => "not verified".to_string(),
    };
    let files = r["files"].as_array().map_or(0, Vec::len);
    let bytes: u64 = r["files"]
        .as_array()
        .map_or(0, |f| f.iter().filter_map(|f| f["size"].as_u64()).sum());
    println!(
        "site {} instance {} (sequence {}): {} {} files, {} bytes, at {} in {} by {}: {verdict} [{}]",
        text("site"),
        text("instance"),
        r["sequence"].as_u64().unwrap_or(0),
        text("outcome"),
        files,
        bytes,
        format_utc(r["delivered_at"].as_i64().unwrap_or(0)),
        text("destination"),
        text("worker"),
        c.source
    );
}
