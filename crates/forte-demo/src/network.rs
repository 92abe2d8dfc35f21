//! Steps 6 to 12, the network path on loopback: the running binary as relay, sender and
//! puller.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};
use forte_catalog::Role;
use forte_daemon::units::human;
use forte_format::keys::KeyPaths;

use crate::data::{tree_digest, write_batches};

const EDGE_TOKEN: &str = "demo-edge-token-not-secret";
const CORE_TOKEN: &str = "demo-core-token-not-secret";

/// Steps 6 to 12, the network path on loopback: this binary as relay, sender and puller.
pub(crate) fn network(root: &Path, keys: &KeyPaths) -> Result<bool> {
    let inbox = root.join("inbox");
    let bytes = write_batches(&inbox)?;
    println!(
        "6. inbox: 14 batches A–N sized like the FORTE test set (scaled to {}), bag files and logs, in {}",
        human(bytes),
        inbox.display()
    );
    let me = std::env::current_exe().context("finding the forte binary")?;
    let mut relay = start_relay(root, &me)?;
    let result = relay_address(&mut relay).and_then(|address| {
        println!(
            "7. relay: {} (HTTPS, self-signed certificate pinned by sha256 {}…)",
            address.url,
            &address.fingerprint[..16]
        );
        let demo = Loopback {
            me: &me,
            root,
            relay: address,
        };
        demo.send_and_pull(keys, &inbox)
    });
    let _ = relay.kill();
    let _ = relay.wait();
    result?;
    println!(
        "11. catalogues: `forte --catalog {0}/core-catalog.sqlite status` lists every batch and file; \
         `… status --file mine-site/batch-A/vehicle.log` prints its lineage",
        root.display()
    );
    println!(
        "12. KPIs: `forte --catalog {0}/edge-catalog.sqlite report --with {0}/core-catalog.sqlite \
         --nominal-rate 3.36TB/day --charts {0}/charts` splits each batch's latency into queueing and \
         processing per task and draws its timeline",
        root.display()
    );
    Ok(true)
}

/// Writes the relay's tokens (one edge, one core) and starts `forte relay` on a free port.
fn start_relay(root: &Path, me: &Path) -> Result<Child> {
    let tokens = root.join("relay-tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\ntoken = \"{EDGE_TOKEN}\"\nrole = \"edge\"\nsite = \"mine-site\"\n\
             [[token]]\ntoken = \"{CORE_TOKEN}\"\nrole = \"core\"\nsites = [\"*\"]\n"
        ),
    )?;
    std::fs::write(root.join("edge.token"), EDGE_TOKEN)?;
    std::fs::write(root.join("core.token"), CORE_TOKEN)?;
    Command::new(me)
        .args(["relay", "--listen", "127.0.0.1:0", "--store"])
        .arg(root.join("relay"))
        .arg("--tokens")
        .arg(&tokens)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the relay")
}

/// Where the relay listens, and its certificate's SHA-256 fingerprint, as it printed them.
struct RelayAddress {
    url: String,
    fingerprint: String,
}

/// Reads the relay's first lines for its URL and certificate fingerprint.
fn relay_address(relay: &mut Child) -> Result<RelayAddress> {
    let stdout = relay.stdout.take().context("relay output")?;
    let mut lines = BufReader::new(stdout).lines();
    let (mut url, mut fingerprint) = (None, None);
    while url.is_none() || fingerprint.is_none() {
        let line = lines
            .next()
            .context("the relay stopped before it was listening")??;
        if let Some(u) = line.strip_prefix("relay listening on ") {
            url = Some(u.to_string());
        }
        if let Some(i) = line.find("sha256 fingerprint ") {
            fingerprint = Some(line[i + 19..].trim_end_matches(')').to_string());
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Ok(RelayAddress {
        url: url.expect("set"),
        fingerprint: fingerprint.expect("set"),
    })
}

/// This binary, and the relay it started, as the demo's edge and core see them.
struct Loopback<'a> {
    me: &'a Path,
    root: &'a Path,
    relay: RelayAddress,
}

impl Loopback<'_> {
    /// Steps 8 to 10: send the inbox, pull it, and compare what arrived.
    fn send_and_pull(&self, keys: &KeyPaths, inbox: &Path) -> Result<()> {
        println!("8. send: each batch in one pass, straight to the relay, the uploads in flight tuned to the link");
        self.forte(
            Role::Edge,
            "send",
            &["-q".as_ref(), inbox.as_os_str()],
            |c| {
                c.arg("--recipient")
                    .arg(&keys.core_pub)
                    .arg("--sign")
                    .arg(&keys.edge_key)
                    .arg("--receipt-pub")
                    .arg(&keys.receipt_pub);
            },
        )?;
        let delivered = self.root.join("dest");
        println!("9. pull: verify, decrypt, deliver each batch atomically under {{site}}/{{batch}}/{{path}}, acknowledge");
        self.forte(Role::Core, "pull", &["-q".as_ref()], |c| {
            c.arg("--to")
                .arg(&delivered)
                .arg("--identity")
                .arg(&keys.core_key)
                .arg("--trust")
                .arg(format!("mine-site={}", keys.edge_pub.display()))
                .arg("--receipt-key")
                .arg(&keys.receipt_key);
        })?;
        let sent = tree_digest(inbox)?
            .into_iter()
            .filter(|(path, _)| !path.ends_with("/.ready"))
            .collect::<BTreeMap<_, _>>();
        let arrived = tree_digest(&delivered.join("mine-site"))?;
        if sent != arrived {
            bail!("delivered files differ from the inbox: this is a bug, please report it");
        }
        let left = std::fs::read_dir(self.root.join("relay/sites/mine-site/objects"))?.count();
        if left > 0 {
            bail!("the relay still holds {left} objects after acknowledgement: this is a bug");
        }
        println!(
            "10. compare: all {} files of 14 batches arrived identical (SHA-256, mtimes); the relay kept nothing after acknowledgement",
            arrived.len()
        );
        Ok(())
    }

    /// Runs `forte COMMAND` as `role` (its own catalogue and token) against the relay.
    fn forte(
        &self,
        role: Role,
        command: &str,
        args: &[&OsStr],
        role_args: impl FnOnce(&mut Command),
    ) -> Result<()> {
        let mut c = Command::new(self.me);
        c.arg("--catalog")
            .arg(self.root.join(format!("{}-catalog.sqlite", role.as_str())))
            .arg(command)
            .args(args)
            .args([
                "--relay",
                &self.relay.url,
                "--relay-fingerprint",
                &self.relay.fingerprint,
            ])
            .arg("--token-file")
            .arg(self.root.join(format!("{}.token", role.as_str())));
        role_args(&mut c);
        let status = c.status()?;
        anyhow::ensure!(status.success(), "{command} failed");
        Ok(())
    }
}
