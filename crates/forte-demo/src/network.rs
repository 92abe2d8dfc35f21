//! Steps 6 to 12, the network path on loopback: the running binary as relay, sender and
//! puller; then the catalogue and the KPIs of the run.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::Child;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::data::{tree_digest, write_batches};
use crate::offline::Keys;
use crate::shell::{command_line, words, Forte};
use crate::SITE;

/// Steps 6 to 12, the network path on loopback: this binary as relay, sender and puller.
pub(crate) fn network(forte: &Forte, root: &Path, keys: &Keys) -> Result<()> {
    let inbox = root.join("inbox");
    let bytes = write_batches(&inbox)?;
    println!(
        "6. inbox: 14 batches A–N sized like the FORTE test set (scaled to {:.1} MB: signals, CAN logs, camera frames), each with a .ready marker, in {}",
        bytes as f64 / 1e6,
        inbox.display()
    );
    println!("7. relay: a token per site and one for the core in its tokens file, then the relay (it prints the flags senders and pullers need)");
    let tokens = root.join("tokens.toml");
    token(
        forte,
        &words![
            "token",
            "--edge",
            SITE,
            "--out",
            root.join(format!("{SITE}.token"))
        ],
        &tokens,
    )?;
    token(
        forte,
        &words!["token", "--core", "*", "--out", root.join("core.token")],
        &tokens,
    )?;
    let words = words![
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--store",
        root.join("relay"),
        "--tokens",
        &tokens
    ];
    let mut relay = forte.spawn(&words)?;
    let result = relay_flags(&mut relay).and_then(|flags| {
        let started = Instant::now();
        send_and_pull(forte, root, keys, &inbox, &flags)?;
        Ok(started.elapsed().as_secs_f64())
    });
    let _ = relay.kill();
    let _ = relay.wait();
    report(forte, root, bytes, result?)
}

/// Runs `forte token …` and appends the entry it prints to the relay's tokens file.
fn token(forte: &Forte, words: &[OsString], tokens: &Path) -> Result<()> {
    forte.show(words, &format!(" >> {}", tokens.display()));
    let entry = forte.run_quietly(words, usize::MAX)?;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(tokens)
        .and_then(|mut f| f.write_all(entry.as_bytes()))
        .with_context(|| format!("cannot write {}", tokens.display()))
}

/// Reads the relay's first lines (printed, indented) up to the flags it tells senders and
/// pullers: `--relay URL --relay-fingerprint HEX`.
fn relay_flags(relay: &mut Child) -> Result<Vec<OsString>> {
    let stdout = relay.stdout.take().context("relay output")?;
    let mut lines = BufReader::new(stdout).lines();
    let flags = loop {
        let line = lines
            .next()
            .context("the relay stopped before it was listening")??;
        println!("     {line}");
        if let Some(flags) = line.strip_prefix("senders and pullers: ") {
            break flags.split_whitespace().map(OsString::from).collect();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Ok(flags)
}

/// Steps 8 to 10: send the inbox, pull it, and compare what arrived.
fn send_and_pull(
    forte: &Forte,
    root: &Path,
    keys: &Keys,
    inbox: &Path,
    relay: &[OsString],
) -> Result<()> {
    println!("8. send: every ready batch in one pass each, straight to the relay, the uploads in flight tuned to the link");
    let mut send = Vec::from(words!["--catalog", root.join("edge.sqlite"), "send", inbox]);
    send.extend(relay.iter().cloned());
    send.extend(words![
        "--token-file",
        root.join(format!("{SITE}.token")),
        "--recipient",
        &keys.core_pub,
        "--sign",
        &keys.edge_key,
        "--receipt-pub",
        &keys.receipt_pub,
        "--site",
        SITE
    ]);
    forte.run(&send)?;
    let delivered = root.join("dest");
    println!("9. pull: verify, decrypt, deliver each batch atomically under {{site}}/{{batch}}/{{path}}, sign a receipt, acknowledge");
    let mut pull = Vec::from(words![
        "--catalog",
        root.join("core.sqlite"),
        "pull",
        "--to",
        &delivered
    ]);
    pull.extend(relay.iter().cloned());
    pull.extend(words![
        "--token-file",
        root.join("core.token"),
        "--identity",
        &keys.core_key,
        "--trust",
        format!("{SITE}={}", keys.edge_pub.display()),
        "--receipt-key",
        &keys.receipt_key
    ]);
    forte.run(&pull)?;
    let sent = tree_digest(inbox)?
        .into_iter()
        .filter(|(path, _)| !path.ends_with("/.ready"))
        .collect::<BTreeMap<_, _>>();
    let arrived = tree_digest(&delivered.join(SITE))?;
    if sent != arrived {
        bail!("delivered files differ from the inbox: this is a bug, please report it");
    }
    let left = std::fs::read_dir(root.join(format!("relay/sites/{SITE}/objects")))?.count();
    if left > 0 {
        bail!("the relay still holds {left} objects after acknowledgement: this is a bug");
    }
    println!(
        "10. compare: all {} files of 14 batches arrived identical (SHA-256, mtimes); the relay kept nothing after acknowledgement",
        arrived.len()
    );
    Ok(())
}

/// Steps 11 and 12: what the core's catalogue recorded, and the run's KPIs and charts, said
/// for what they are: `bytes` moved in `seconds` on loopback measure this machine, not a link.
fn report(forte: &Forte, root: &Path, bytes: u64, seconds: f64) -> Result<()> {
    let (edge, core) = (root.join("edge.sqlite"), root.join("core.sqlite"));
    println!("11. catalogues: every batch and file with its state and stage times, and one file's lineage from discovery at the edge to delivery");
    let status = words!["--catalog", &core, "status"];
    forte.show(&status, "");
    forte.run_quietly(&status, 12)?;
    let file = format!("{SITE}/batch-A/can.log");
    forte.run(&words!["--catalog", &core, "status", "--file", file])?;
    println!("12. KPIs: each batch's latency split into queueing and processing per task, the run's rate, and charts");
    forte.run(&words![
        "--catalog",
        &edge,
        "report",
        "--with",
        &core,
        "--charts",
        root.join("charts")
    ])?;
    let nominal = words![
        "--catalog",
        &edge,
        "report",
        "--with",
        &core,
        "--nominal-rate",
        "3.36TB/day"
    ];
    println!(
        "    note: {:.0} MB in {seconds:.1} s on loopback measures this machine, not a link, and a daily capacity \
         extrapolated from seconds is no forecast; so the demo asks for no verdict. At a site, after a day's \
         traffic, `{}` says whether the site keeps up with its nominal rate.",
        bytes as f64 / 1e6,
        command_line(&nominal)
    );
    Ok(())
}
