//! The second copy in an S3-compatible bucket (`pull --copy-to s3://…`), against a real S3
//! server: versitygw serving a directory (`.ci/run` installs it from the Go module proxy).

use std::collections::BTreeMap;

use forte_bucket::test_server::{S3Server, SECRET};

use crate::common::site::*;
use crate::common::*;

/// `pull` with `--copy-to`, and the S3 server's endpoint and keys.
trait PullWithCopy {
    /// `pull` with `--copy-to URL` and this server's endpoint and keys (`secret` instead of
    /// the right one, to test refusal).
    fn pull(&self, site: &Site, url: &str, secret: &str) -> std::process::Output;

    /// [`PullWithCopy::pull`] with the right keys, which must succeed.
    fn pull_ok(&self, site: &Site, url: &str) {
        let out = self.pull(site, url, SECRET);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// [`PullWithCopy::pull`], which must fail; its stderr.
    fn pull_fails(&self, site: &Site, url: &str, secret: &str) -> String {
        let out = self.pull(site, url, secret);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "pull succeeded: {stderr}");
        stderr
    }
}

impl PullWithCopy for S3Server {
    fn pull(&self, site: &Site, url: &str, secret: &str) -> std::process::Output {
        let mut args = site.pull();
        args.extend(args!["--copy-to", url]);
        forte().args(&args).envs(self.env(secret)).output().unwrap()
    }
}

/// A site whose batch (see [`batch`]) was sent to its relay, an S3 server with the bucket
/// `analysts`, and the batch's files; `None` when there is no S3 server (outside CI).
fn sent() -> Option<(Site, S3Server, BTreeMap<String, String>)> {
    let site = Site::new();
    let s3 = S3Server::start(&site.root.join("s3"), &["analysts"])?;
    let expected = batch(&site);
    ok(&site.send(&["-q"]));
    Some((site, s3, expected))
}

/// `pull --to s3://analysts/primary` with `scratch` as its scratch directory, which must
/// succeed.
fn pull_into_bucket(site: &Site, s3: &S3Server, scratch: &std::path::Path) {
    let mut args = site.pull();
    let to = args.iter().position(|a| a == "--to").unwrap();
    args[to + 1] = "s3://analysts/primary".into();
    args.extend(args!["--scratch", scratch]);
    let out = forte().args(&args).envs(s3.env(SECRET)).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn batch(site: &Site) -> BTreeMap<String, String> {
    let dir = site.root.join("inbox/run-1");
    write(&dir.join("big.bin"), &random_bytes(19 << 20));
    write(&dir.join("logs/a.txt"), b"hello\n");
    write(&dir.join(".ready"), b"");
    source_hashes(&dir)
}

/// Every file lands in the bucket under the layout's names, identical, with its SHA-256 as
/// metadata: a second pull of the same batch finds the objects there and keeps them.
#[test]
fn a_second_copy_in_a_bucket_is_whole_and_carries_its_sha256() {
    let Some((site, s3, expected)) = sent() else {
        return;
    };
    s3.pull_ok(&site, "s3://analysts/copy");
    let copied = s3.root.join("analysts/copy/site-a/run-1");
    assert_eq!(visible(&copied), expected);
    assert!(
        site.relay_objects().is_empty(),
        "acknowledged after the copy"
    );

    // The same batch again (a fresh edge catalogue sends it anew): the objects in the bucket
    // are known by their SHA-256 and kept.
    std::fs::remove_file(&site.edge_catalog).unwrap();
    ok(&site.send(&["-q"]));
    s3.pull_ok(&site, "s3://analysts/copy");
    assert_eq!(visible(&copied), expected);
}

/// An object in the way with other contents is not overwritten, and the batch is not
/// acknowledged: the relay keeps it.
#[test]
fn an_object_with_other_contents_is_not_overwritten() {
    let Some((site, s3, _)) = sent() else {
        return;
    };
    let in_the_way = s3.root.join("analysts/site-a/run-1/logs/a.txt");
    write(&in_the_way, b"someone else's\n");
    let stderr = s3.pull_fails(&site, "s3://analysts", SECRET);
    assert!(
        stderr.contains("s3://analysts/site-a/run-1/logs/a.txt exists with other contents"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&in_the_way).unwrap(), b"someone else's\n");
    assert!(!site.relay_objects().is_empty(), "not acknowledged");
}

/// A missing bucket or a wrong key fails at start, saying which and what to do, and nothing is
/// pulled.
#[test]
fn a_missing_bucket_or_a_bad_key_fails_before_anything_is_pulled() {
    let Some((site, s3, _)) = sent() else {
        return;
    };
    let stderr = s3.pull_fails(&site, "s3://nosuch/copy", SECRET);
    assert!(
        stderr.contains("bucket nosuch does not exist") && stderr.contains("NoSuchBucket"),
        "{stderr}"
    );
    let stderr = s3.pull_fails(&site, "s3://analysts/copy", "wrong-secret");
    assert!(
        stderr.contains("refused the credentials for bucket analysts")
            && stderr.contains("AWS_SECRET_ACCESS_KEY"),
        "{stderr}"
    );
    assert!(
        visible(&site.root.join("dest")).is_empty(),
        "nothing pulled"
    );
    assert!(!site.relay_objects().is_empty());
}

/// A bucket as the destination (`--to s3://…`): every file lands there under the layout's
/// names, whole and carrying its SHA-256, the scratch directory it was assembled in is left
/// empty, and the relay is emptied; a directory's `--scratch` is refused.
#[test]
fn a_bucket_as_the_destination_gets_every_file_and_the_scratch_is_left_empty() {
    let Some((site, s3, expected)) = sent() else {
        return;
    };
    let scratch = site.root.join("scratch");
    pull_into_bucket(&site, &s3, &scratch);
    assert_eq!(
        visible(&s3.root.join("analysts/primary/site-a/run-1")),
        expected
    );
    assert_eq!(
        visible(&scratch),
        BTreeMap::new(),
        "the scratch directory is left empty"
    );
    assert!(
        site.relay_objects().is_empty(),
        "acknowledged once in the bucket"
    );

    let mut args = site.pull();
    args.extend(args!["--scratch", &scratch]);
    let stderr = fails(&args);
    assert!(
        stderr.contains("--scratch is for a bucket destination"),
        "{stderr}"
    );
}

/// A later version of a file (changed after its batch was delivered) replaces it in a bucket
/// destination too, the earlier object kept in the bucket as
/// `.forte-replaced/TARGET.SHA256`. Before: "exists with other contents; refusing to
/// overwrite it", on every pull.
#[test]
fn a_later_version_replaces_the_earlier_object_in_a_bucket_which_keeps_it() {
    let Some((site, s3, _)) = sent() else {
        return;
    };
    let scratch = site.root.join("scratch");
    let pull = || pull_into_bucket(&site, &s3, &scratch);
    pull();
    let log = site.root.join("inbox/run-1/logs/a.txt");
    write(&log, b"hello again, longer\n");
    ok(&site.send(&["-q"]));
    pull();
    let primary = s3.root.join("analysts/primary");
    assert_eq!(
        std::fs::read(primary.join("site-a/run-1/logs/a.txt")).unwrap(),
        b"hello again, longer\n"
    );
    let kept = primary.join(".forte-replaced/site-a/run-1/logs");
    let names: Vec<String> = std::fs::read_dir(&kept)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].starts_with("a.txt."), "{names:?}");
    assert_eq!(std::fs::read(kept.join(&names[0])).unwrap(), b"hello\n");
}
