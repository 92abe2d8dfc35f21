//! Rotating an edge's signing key (`send --sign` with a new key, the core trusting both) sends
//! only what is new: batches sent or cancelled before stay so, new batches are signed with the
//! new key.

use std::ffi::OsString;
use std::path::Path;

use crate::common::site::{visible, write_batch, Site};
use crate::common::*;

/// `args` with the value of `flag` replaced by `value`.
fn with_value(mut args: Args, flag: &str, value: &Path) -> Args {
    let at = args.iter().position(|a| a == flag).expect("the flag") + 1;
    args[at] = OsString::from(value);
    args
}

/// The batches a `send --json` run sent files of.
fn sent_batches(out: &str) -> Vec<String> {
    let out = crate::common::strict_json(out);
    let mut sent: Vec<String> = out["batches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["sent"].as_u64() > Some(0))
        .map(|b| b["batch"].as_str().unwrap().to_owned())
        .collect();
    sent.sort();
    sent
}

#[test]
fn a_new_signing_key_sends_only_new_batches() {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    for name in ["b1", "b2", "b3"] {
        write_batch(&inbox, name, 2, 5_000);
    }
    let sent = ok(&site.send(&["--json", "-q"]));
    assert_eq!(sent_batches(&sent), ["b1", "b2", "b3"]);
    ok(&site.send(&["--cancel", "b3"]));

    // The edge's key is replaced; the core trusts the old key and the new one.
    let new = keygen(&site.root.join("new-keys"));
    write_batch(&inbox, "b4", 2, 5_000);
    let send = with_value(site.send(&["--json", "-q"]), "--sign", &new.edge_key);
    let sent = ok(&send);
    assert_eq!(sent_batches(&sent), ["b4"], "{sent}");

    let both = site.root.join("both.pub");
    let mut keys = std::fs::read(&site.keys.edge_pub).unwrap();
    keys.extend(std::fs::read(&new.edge_pub).unwrap());
    write(&both, &keys);
    let trust = format!("site-a={}", both.display());
    let pull = with_value(site.pull(), "--trust", Path::new(&trust));
    ok(&pull);
    let delivered: Vec<String> = visible(&site.root.join("dest")).into_keys().collect();
    assert_eq!(
        delivered,
        [
            "site-a/b1/bags/000.bag",
            "site-a/b1/bags/001.bag",
            "site-a/b2/bags/000.bag",
            "site-a/b2/bags/001.bag",
            "site-a/b4/bags/000.bag",
            "site-a/b4/bags/001.bag"
        ]
    );
}
