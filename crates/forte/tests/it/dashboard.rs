//! The JSON API and the dashboard (docs/api.md), served by the daemons with `--http` and by
//! `forte dashboard` over catalogues, read while a real transfer runs.

use std::path::Path;

use serde_json::Value;

use crate::common::site::*;
use crate::common::*;

/// `GET path` at `addr` as JSON, with its status.
fn get_json(addr: &str, path: &str) -> (u16, Value) {
    let (status, body) = http_get(addr, path, &[]).unwrap_or_else(|| panic!("{addr}{path}"));
    let json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
    (status, json)
}

/// `GET path` at `addr` that must answer 200 with JSON.
fn api(addr: &str, path: &str) -> Value {
    let (status, json) = get_json(addr, path);
    assert_eq!(status, 200, "{path}: {json}");
    json
}

/// The batch called `name` that the API at `addr` lists, if any.
fn batch_named(addr: &str, name: &str) -> Option<Value> {
    api(addr, &format!("/api/v1/batches?name={name}"))["batches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .cloned()
}

/// A site whose sender (its upload paced at `bwlimit`, in parts of 1 MiB) and puller run as
/// daemons serving `--http` on `edge` and `core`, both answering already.
struct LiveSite {
    site: Site,
    inbox: std::path::PathBuf,
    edge: String,
    core: String,
    _daemons: [Daemon; 2],
}

impl LiveSite {
    fn start(site: Site, bwlimit: &str) -> Self {
        let inbox = site.root.join("inbox");
        std::fs::create_dir_all(&inbox).unwrap();
        let (edge, core) = (free_addr(), free_addr());
        let watch = ["--watch", "--interval", "1", "--http"];
        let mut send = site.send(&watch);
        send.extend(args![&edge, "--bwlimit", bwlimit, "--part-size", "1MiB"]);
        let mut pull = site.pull();
        pull.extend(watch.map(Into::into));
        pull.push(core.clone().into());
        let daemons = [spawn(&send), spawn(&pull)];
        for addr in [&edge, &core] {
            assert!(wait_for(20, || http_get(addr, "/api/v1", &[]).is_some()));
        }
        Self {
            site,
            inbox,
            edge,
            core,
            _daemons: daemons,
        }
    }
}

#[test]
fn the_daemons_api_follows_a_transfer_from_progress_to_lineage() {
    // 8 MB at 2 MB/s: seconds in which to see the batch move.
    let live = LiveSite::start(Site::new(), "2MB");
    let (site, inbox, edge, core) = (&live.site, &live.inbox, &live.edge, &live.core);
    let info = api(edge, "/api/v1");
    assert_eq!(
        (info["api"].as_i64(), info["role"].as_str()),
        (Some(1), Some("edge"))
    );

    // Incompressible, so that the limit (on the wire's bytes) makes it last about 4 s.
    let batch = inbox.join("measured");
    for i in 0..4 {
        write(
            &batch.join(format!("bags/{i:03}.bag")),
            &random_bytes(2_000_000),
        );
    }
    write(&batch.join(".ready"), b"");
    let expected = source_hashes(&batch);
    // While it is sent: in flight, with progress that grows, a rate and an ETA.
    let mut seen = vec![];
    let sending = wait_for(30, || {
        let o = api(edge, "/api/v1/overview");
        if let Some(b) = o["in_flight"].as_array().unwrap().first() {
            if b["state"] == "sending" && b["eta_s"].is_number() {
                seen.push(b["done_bytes"].as_i64().unwrap());
            }
        }
        seen.len() >= 3 && seen.last() > seen.first()
    });
    assert!(sending, "progress seen while sending: {seen:?}");
    let stages = api(edge, "/api/v1/stages");
    let names: Vec<&str> = stages["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"compress"), "{stages}");
    assert!(stages["queue"]["files"].is_number(), "{stages}");

    let dest = site.root.join("dest/site-a/measured");
    assert!(wait_for(60, || visible(&dest) == expected), "not delivered");
    let delivered = wait_for(10, || {
        batch_named(core, "measured").is_some_and(|b| b["state"] == "delivered")
    });
    assert!(delivered, "{:?}", batch_named(core, "measured"));
    let at_core = batch_named(core, "measured").unwrap();
    assert_eq!(at_core["progress"].as_f64(), Some(1.0), "{at_core}");
    assert_eq!(at_core["role"], "core");
    let sent = batch_named(edge, "measured").unwrap();
    assert_eq!(
        (sent["state"].as_str(), sent["files"].as_i64()),
        (Some("sent"), Some(4))
    );
    assert_eq!(sent["bytes"].as_i64(), Some(8_000_000));
    assert!(sent["eta_s"].is_null(), "an ended batch has no ETA: {sent}");
    // Raw bytes over the stage's time (the limit is on the wire's, compressed, bytes).
    let rate = sent["rate_bytes_per_second"].as_f64().unwrap();
    let seconds =
        (sent["ended_us"].as_i64().unwrap() - sent["started_us"].as_i64().unwrap()) as f64 / 1e6;
    assert!(
        (rate * seconds - 8e6).abs() < 1e3,
        "{rate} B/s over {seconds} s"
    );

    // The batch, its files and a file's lineage, at the core.
    let key = at_core["key"].as_str().unwrap();
    let detail = api(core, &format!("/api/v1/batches/{key}"));
    let files = detail["files"].as_array().unwrap();
    assert_eq!(files.len(), 4, "{detail}");
    let file = files.iter().find(|f| f["path"] == "bags/000.bag").unwrap();
    assert_eq!(
        file["sha256"].as_str(),
        expected.get("bags/000.bag").map(String::as_str)
    );
    let id = file["object_id"].as_str().unwrap();
    let lineage = api(core, &format!("/api/v1/files/{id}"));
    let events: Vec<&str> = lineage["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["state"].as_str().unwrap())
        .collect();
    assert!(
        events.contains(&"verified") && events.contains(&"delivered"),
        "{events:?}"
    );
    // The KPIs need the edge's rows too (the dashboard over both catalogues shows them).
    let kpis = api(core, "/api/v1/kpis");
    assert!(kpis["batches"].is_array(), "{kpis}");

    // Searches, and what is not there.
    // Acknowledged a moment after the batch is recorded delivered.
    let found = || api(core, "/api/v1/files?name=001&state=acknowledged");
    let one = wait_for(10, || found()["files"].as_array().unwrap().len() == 1);
    assert!(one, "{}", found());
    let none = api(core, "/api/v1/batches?state=failed");
    assert!(none["batches"].as_array().unwrap().is_empty(), "{none}");
    let (status, bad) = get_json(core, "/api/v1/batches?state=lost");
    assert_eq!(status, 400);
    assert!(bad["error"].as_str().unwrap().contains("\"lost\""), "{bad}");
    let (status, bad) = get_json(core, "/api/v1/batches?limit=many");
    assert_eq!(status, 400);
    assert!(bad["error"].as_str().unwrap().contains("limit"), "{bad}");
    let (status, nowhere) = get_json(core, "/api/v2/batches");
    assert_eq!(status, 404);
    assert!(
        nowhere["error"].as_str().unwrap().contains("/api/v1"),
        "{nowhere}"
    );
    let (status, missing) = get_json(core, "/api/v1/batches/site-a/0000");
    assert_eq!(status, 404);
    assert!(missing["error"].as_str().unwrap().contains("site-a/0000"));
    // /metrics is on the same server.
    assert!(scraped(edge, "forte_batches_total", &[("outcome", "sent")]) == Some(1.0));
}

/// A non-loopback address of this machine, to be "another host" to a server on it.
fn other_host_address() -> Option<String> {
    let out = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|cidr| cidr.split('/').next())
        .find(|ip| !ip.starts_with("127."))
        .map(str::to_owned)
}

#[test]
fn another_host_is_refused_without_the_token_and_served_with_it() {
    let Some(ip) = other_host_address() else {
        assert!(
            std::env::var("CI").is_err(),
            "CI must test access from another host: this machine has no non-loopback IPv4 address"
        );
        eprintln!("SKIPPED: no non-loopback IPv4 address to connect from");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.sqlite").display().to_string();
    write(std::path::Path::new(&catalog), b""); // the dashboard reads catalogues, never makes one
    let port = free_addr().rsplit_once(':').unwrap().1.to_owned();
    let open = format!("0.0.0.0:{port}");
    let (from_here, from_there) = (format!("127.0.0.1:{port}"), format!("{ip}:{port}"));
    // Without a token file: this machine only.
    let mut dashboard = spawn(&args!["--catalog", &catalog, "dashboard", "--http", &open]);
    assert!(wait_for(20, || http_get(&from_here, "/api/v1", &[]).is_some()));
    assert_eq!(get_json(&from_here, "/api/v1/batches").0, 200);
    let (status, refused) = get_json(&from_there, "/api/v1/batches");
    assert_eq!(status, 403, "{refused}");
    assert!(refused["error"]
        .as_str()
        .unwrap()
        .contains("--http-token-file"));
    let (status, _) = http_get(&from_there, "/", &[]).unwrap();
    assert_eq!(status, 403, "the dashboard's pages too");
    kill(&mut dashboard);

    // With one: the token, as a header or in the address.
    let token_file = dir.path().join("http.token");
    write(&token_file, b"a-long-random-token\n");
    let _dashboard = spawn(&args![
        "--catalog",
        &catalog,
        "dashboard",
        "--http",
        &open,
        "--http-token-file",
        &token_file
    ]);
    assert!(wait_for(20, || http_get(&from_here, "/api/v1", &[]).is_some()));
    let (status, refused) = get_json(&from_there, "/api/v1/batches");
    assert_eq!(status, 401, "{refused}");
    let wrong = http_get(&from_there, "/api/v1", &["Authorization: Bearer wrong"]).unwrap();
    assert_eq!(wrong.0, 401, "{}", wrong.1);
    let right = ["Authorization: Bearer a-long-random-token"];
    assert_eq!(http_get(&from_there, "/api/v1", &right).unwrap().0, 200);
    // In a browser's address, the token is exchanged once for a cookie (HttpOnly,
    // SameSite=Strict) and the page reloaded without it: not copied into links or history.
    let head = http_head(
        &from_there,
        "/history?name=x&token=a-long-random-token",
        &[],
    )
    .unwrap();
    assert!(
        head.starts_with("HTTP/1.0 303") || head.starts_with("HTTP/1.1 303"),
        "{head}"
    );
    assert!(head.contains("location: /history?name=x"), "{head}");
    assert!(
        head.contains(
            "set-cookie: forte_token=a-long-random-token; HttpOnly; SameSite=Strict; Path=/"
        ),
        "{head}"
    );
    let page = http_get(
        &from_there,
        "/",
        &["Cookie: forte_token=a-long-random-token"],
    )
    .unwrap();
    assert_eq!(page.0, 200);
    assert!(!page.1.contains("token="), "links carry no token");
    // A bad token file is named.
    let empty = dir.path().join("empty.token");
    write(&empty, b"\n");
    let stderr = fails(&args![
        "--catalog",
        &catalog,
        "dashboard",
        "--http",
        "127.0.0.1:0",
        "--http-token-file",
        &empty
    ]);
    assert!(stderr.contains("empty.token is empty"), "{stderr}");
}

/// Runs a transfer of `batches` (name, files, bytes each) with a failing one, then serves
/// `forte dashboard` over both catalogues: returns the site, the dashboard's address and its
/// process.
fn transferred_site(batches: &[(&str, usize, usize)]) -> (Site, String, Daemon) {
    let site = Site::new();
    let inbox = site.root.join("inbox");
    for (name, files, size) in batches {
        write_batch(&inbox, name, *files, *size);
    }
    ok(&site.send(&[]));
    ok(&site.pull());
    let addr = free_addr();
    let dashboard = spawn(&args![
        "--catalog",
        &site.edge_catalog,
        "dashboard",
        "--with",
        &site.core_catalog,
        "--http",
        &addr
    ]);
    assert!(wait_for(20, || http_get(&addr, "/", &[]).is_some()));
    (site, addr, dashboard)
}

#[test]
fn the_dashboard_reads_without_javascript_over_both_catalogues() {
    let (_site, addr, _dashboard) = transferred_site(&[("run-a", 2, 300_000), ("run-b", 1, 10)]);
    let (status, home) = http_get(&addr, "/", &[]).unwrap();
    assert_eq!(status, 200);
    assert!(home.contains("run-a") && home.contains("run-b"), "{home}");
    assert!(home.contains("<noscript><meta http-equiv=\"refresh\""));
    // Both ends of the path: the edge's and the core's rows.
    let batches = api(&addr, "/api/v1/batches?name=run-a")["batches"].clone();
    let roles: Vec<&str> = batches
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles.len(), 2, "{batches}");
    assert!(roles.contains(&"edge") && roles.contains(&"core"));
    let core_key = batches
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["role"] == "core")
        .unwrap()["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, page) = http_get(&addr, &format!("/batches/{core_key}"), &[]).unwrap();
    assert_eq!(status, 200);
    assert!(page.contains("bags/000.bag") && page.contains("bags/001.bag"));
    // A file's lineage from discovery at the edge to delivery at the core.
    let file = api(&addr, "/api/v1/files?name=000.bag&role=core")["files"][0].clone();
    let id = file["object_id"].as_str().unwrap();
    let (status, lineage) = http_get(&addr, &format!("/files/{id}"), &[]).unwrap();
    assert_eq!(status, 200);
    // Each row and event says which end recorded it, and names its batch (not by its key).
    assert!(lineage.contains("<td>edge</td>") && lineage.contains("<td>core</td>"));
    let named = api(&addr, &format!("/api/v1/files/{id}"))["batch_names"].clone();
    let name = named
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    assert!(name.starts_with("run-"), "{named}");
    assert!(lineage.contains(&format!(">{name}</a></dd>")), "{lineage}");
    assert!(lineage.contains(&format!("\">{name}</td>")), "{lineage}");
    // It travelled in a bundle: no part of its own to verify.
    for state in ["discovered", "sealed", "delivered", "acknowledged"] {
        assert!(
            lineage.contains(&format!(">{state}<")),
            "{state} in {lineage}"
        );
    }
    let (status, history) = http_get(&addr, "/history?name=run-b&within=1h", &[]).unwrap();
    assert_eq!(status, 200);
    assert!(history.contains("run-b") && !history.contains(">run-a<"));
    // By time: nothing changed after now.
    let later = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        + 1_000_000;
    let none = api(&addr, &format!("/api/v1/batches?since_us={later}"));
    assert!(none["batches"].as_array().unwrap().is_empty(), "{none}");
    let earlier = api(&addr, &format!("/api/v1/batches?until_us={later}"));
    assert_eq!(earlier["batches"].as_array().unwrap().len(), 4, "{earlier}");
    let kpis = api(&addr, "/api/v1/kpis");
    assert_eq!(kpis["run"]["delivered"].as_i64(), Some(2), "{kpis}");
    let (status, report) = http_get(&addr, "/report", &[]).unwrap();
    assert_eq!(status, 200);
    assert!(report.contains("delivered") && report.contains("timeline.svg"));
    let (status, svg) = http_get(&addr, "/api/v1/charts/timeline.svg", &[]).unwrap();
    assert_eq!(status, 200);
    assert!(svg.starts_with("<svg") || svg.starts_with("<?xml"), "{svg}");
    // The live stream: a first event at once, the page's sections rendered again.
    let (status, stream) = first_event(&addr, "/live/overview");
    assert_eq!(status, 200);
    assert!(stream.contains("event: sections"), "{stream}");
    assert!(stream.contains("in-flight") && stream.contains("run-a"));
}

/// The head of a server-sent event stream at `path`: its status and what came in a second.
fn first_event(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_millis(1500)))
        .unwrap();
    let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut got = vec![];
    let mut buf = [0u8; 65536];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&got).contains("\n\n") && got.len() > 200 {
            break;
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[test]
fn a_failed_batch_shows_its_error_in_the_api_the_alerts_and_the_page() {
    // The relay holds at most 1 MiB of a site: a 3 MB file is refused, and no retry helps.
    let site = Site::with_relay_flags(&["--quota-per-site", "1MiB"]);
    let inbox = site.root.join("inbox");
    write(&inbox.join("too-big/noise.bin"), &random_bytes(3_000_000));
    write(&inbox.join("too-big/.ready"), b"");
    let stderr = fails(&site.send(&[]));
    let addr = free_addr();
    let _dashboard = spawn(&args![
        "--catalog",
        &site.edge_catalog,
        "dashboard",
        "--http",
        &addr
    ]);
    assert!(wait_for(20, || http_get(&addr, "/", &[]).is_some()));
    let failed = api(&addr, "/api/v1/batches?state=failed")["batches"][0].clone();
    assert_eq!(failed["name"], "too-big", "{failed}");
    let error = failed["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        error.contains("413"),
        "the relay's refusal: {error} (send said {stderr})"
    );
    let failures = api(&addr, "/api/v1/failures");
    assert!(
        failures["failures"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["error"].as_str().unwrap().contains("413")),
        "{failures}"
    );
    let overview = api(&addr, "/api/v1/overview");
    let alerts = overview["alerts"].to_string();
    assert!(
        alerts.contains("too-big") && alerts.contains("critical"),
        "{alerts}"
    );
    let (_, home) = http_get(&addr, "/", &[]).unwrap();
    assert!(
        home.contains("class=\"critical\"") && home.contains("413"),
        "{home}"
    );
}

/// The Python that drives the browser (selenium), and whether Chromium is here; `None` when
/// they are missing outside CI (in CI that fails the test).
fn browser_python() -> Option<String> {
    let python = std::env::var("FORTE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_selenium = std::process::Command::new(&python)
        .args(["-c", "import selenium"])
        .status()
        .is_ok_and(|s| s.success());
    let has_chromium =
        Path::new("/usr/bin/chromium").exists() && Path::new("/usr/bin/chromedriver").exists();
    if has_selenium && has_chromium {
        return Some(python);
    }
    let missing = format!(
        "the browser test needs selenium in {python} (FORTE_TEST_PYTHON) and Debian's chromium and chromium-driver (./test.sh installs them)"
    );
    assert!(std::env::var("CI").is_err(), "{missing}");
    eprintln!("SKIPPED: {missing}");
    None
}

#[test]
fn the_dashboard_lives_in_a_browser_while_a_transfer_runs() {
    let Some(python) = browser_python() else {
        return;
    };
    // A quota the second batch is larger than: the relay refuses it, and no retry helps.
    let live = LiveSite::start(
        Site::with_relay_flags(&["--quota-per-site", "10MiB"]),
        "1MB",
    );
    let (inbox, edge, core) = (&live.inbox, &live.edge, &live.core);
    run_in_browser(
        &python,
        "browser.py",
        &args![format!("http://{edge}"), format!("http://{core}"), inbox],
    );
}

/// Runs the selenium script `script` (in tests/it) with `python` and `script_args`, printing
/// what it printed; fails the test with its output if it failed.
fn run_in_browser(python: &str, script: &str, script_args: &Args) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/it")
        .join(script);
    let out = std::process::Command::new(python)
        .arg(script)
        .args(script_args)
        .output()
        .expect("running the browser test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the browser test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_relay_serves_its_metrics_and_the_api_on_http() {
    let addr = free_addr();
    let site = Site::with_relay_flags(&["--http", &addr]);
    assert!(wait_for(20, || http_get(&addr, "/api/v1", &[]).is_some()));
    let info = api(&addr, "/api/v1");
    assert_eq!(info["role"], "relay", "{info}");
    assert_eq!(info["catalogs"].as_array().map(Vec::len), Some(0));
    // Nothing held yet: the page says so, rather than drawing empty tables or axes.
    let (status, empty) = http_get(&addr, "/", &[]).unwrap();
    assert_eq!(status, 200);
    assert!(empty.contains("The relay holds nothing"), "{empty}");
    write_batch(&site.root.join("inbox"), "one", 1, 1000);
    ok(&site.send(&[]));
    let stored = scraped(&addr, "forte_relay_batches_sealed_total", &[]);
    assert_eq!(stored, Some(1.0), "{:?}", scrape(&addr).map(|s| s.docs));
    let (status, page) = http_get(&addr, "/", &[]).unwrap();
    assert_eq!(status, 200);
    assert!(page.contains("relay overview"), "{page}");
    // What the store holds, in the API, on the page and in gauges: the numbers of
    // `forte relay-store list`.
    let listed = strict_json(&ok(&args![
        "relay-store",
        "list",
        "--store",
        &site.relay.store,
        "--json"
    ]));
    let held = api(&addr, "/api/v1/relay");
    let batch = &held["batches"][0];
    assert_eq!(batch["site"], listed[0]["site"], "{held} {listed}");
    assert_eq!(batch["batch"], listed[0]["batch"]);
    assert_eq!(batch["objects"], listed[0]["objects"]);
    assert_eq!(batch["bytes"], listed[0]["bytes"]);
    assert_eq!(batch["state"], "sealed");
    let bytes = listed[0]["bytes"].as_f64().unwrap();
    let site_a = [("site", "site-a")];
    assert_eq!(
        scraped(&addr, "forte_relay_site_held_bytes", &site_a),
        Some(bytes)
    );
    assert_eq!(
        scraped(&addr, "forte_relay_site_sealed_batches", &site_a),
        Some(1.0)
    );
    assert_eq!(scraped(&addr, "forte_relay_held_bytes", &[]), Some(bytes));
    assert_described(&scrape(&addr).unwrap(), "the relay");
    let page = http_get(&addr, "/", &[]).unwrap().1;
    assert!(
        page.contains(listed[0]["batch"].as_str().unwrap()),
        "{page}"
    );
    // Delivered and acknowledged: nothing held, every gauge back to 0.
    ok(&site.pull());
    assert!(wait_for(20, || scraped(
        &addr,
        "forte_relay_site_held_bytes",
        &site_a
    ) == Some(0.0)));
}

/// Against DNS rebinding, a request naming another host is refused (a page elsewhere that
/// rebinds its own name to 127.0.0.1); the server's addresses, localhost and the names given
/// by --http-name are answered. Served on [::], an IPv4 client on this machine (::ffff:127.0.0.1)
/// is this machine; the start warns that [::] is reachable beyond it.
#[test]
fn the_dashboard_answers_only_to_its_own_names() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.sqlite").display().to_string();
    write(std::path::Path::new(&catalog), b""); // the dashboard reads catalogues, never makes one
    let port = free_addr().rsplit_once(':').unwrap().1.to_owned();
    let log = dir.path().join("dashboard.log");
    let _dashboard = spawn_logged(
        &args![
            "--catalog",
            &catalog,
            "dashboard",
            "--http",
            format!("[::]:{port}"),
            "--http-name",
            "forte.mine.example"
        ],
        &log,
    );
    let here = format!("127.0.0.1:{port}");
    assert!(wait_for(20, || http_get(&here, "/api/v1", &[]).is_some()));
    assert_eq!(
        http_get(&here, "/api/v1/batches", &[]).unwrap().0,
        200,
        "IPv4-mapped loopback"
    );
    for (host, status) in [
        ("localhost", 200),
        ("127.0.0.1", 200),
        ("forte.mine.example", 200),
        ("attacker.example", 421),
        ("localhost.attacker.example", 421),
    ] {
        let answer = http_get_as(&here, host, "/api/v1/batches").unwrap();
        assert_eq!(answer.0, status, "Host: {host}: {}", answer.1);
    }
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("reachable beyond this machine"), "{said}");
}

/// SIGTERM ends the dashboard with status 0 and one line, like every daemon.
#[test]
fn the_dashboard_ends_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.sqlite").display().to_string();
    write(std::path::Path::new(&catalog), b""); // the dashboard reads catalogues, never makes one
    let addr = free_addr();
    let log = dir.path().join("dashboard.log");
    let mut dashboard = spawn_logged(
        &args!["--catalog", &catalog, "dashboard", "--http", &addr],
        &log,
    );
    assert!(wait_for(20, || http_get(&addr, "/api/v1", &[]).is_some()));
    let status = signal_and_wait(&mut dashboard, libc::SIGTERM, 10);
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(status.is_some_and(|s| s.success()), "{status:?}: {said}");
    assert!(said.contains("dashboard stopped (SIGTERM)"), "{said}");
}

/// Issue 46's picture of a batch from edge to core, in a browser: two sites' `send --watch`
/// daemons send a batch of the same name through one relay, `forte dashboard` reads both
/// edges' catalogues and the core's. Each batch is one row moving through its phases, the
/// relay's page shows what `forte relay-store list` lists, and no page logs an error
/// (merged_dashboard.py says what it checks).
#[test]
fn the_merged_dashboard_follows_each_batch_once_from_edge_to_core() {
    let Some(python) = browser_python() else {
        return;
    };
    let relay_page = free_addr();
    let site = Site::with_relay_flags(&["--http", &relay_page, "--quota-per-site", "1GiB"]);
    let (inbox_a, inbox_b) = (site.root.join("inbox"), site.root.join("inbox-b"));
    for inbox in [&inbox_a, &inbox_b] {
        std::fs::create_dir_all(inbox).unwrap();
    }
    let edge_a = free_addr();
    let paced = [
        "--watch",
        "--interval",
        "1",
        "--bwlimit",
        "1MB",
        "--part-size",
        "1MiB",
    ];
    let mut send_a = site.send(&paced);
    send_a.extend(args!["--http", &edge_a]);
    let _daemons = [
        spawn(&send_a),
        spawn(&site.send_as_site_b(&site.keys, &paced)),
    ];
    let mut pull = site.pull();
    pull.extend(args![
        "--trust",
        format!("site-b={}", site.keys.edge_pub.display())
    ]);
    // The dashboard reads catalogues that exist: the core's is made by a pull of nothing yet.
    ok(&pull);
    let edge_b_catalog = site.root.join("edge-b.sqlite").display().to_string();
    assert!(wait_for(20, || Path::new(&edge_b_catalog).exists()
        && Path::new(&site.edge_catalog).exists()));
    let dashboard = free_addr();
    let _dashboard = spawn(&args![
        "--catalog",
        &site.edge_catalog,
        "dashboard",
        "--with",
        &edge_b_catalog,
        "--with",
        &site.core_catalog,
        "--http",
        &dashboard
    ]);
    for addr in [&relay_page, &edge_a, &dashboard] {
        assert!(wait_for(20, || http_get(addr, "/api/v1", &[]).is_some()));
    }
    let pull: Vec<String> = pull
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    run_in_browser(
        &python,
        "merged_dashboard.py",
        &args![
            format!("http://{dashboard}"),
            format!("http://{relay_page}"),
            format!("http://{edge_a}"),
            &inbox_a,
            &inbox_b,
            forte_binary(),
            &site.relay.store,
            serde_json::to_string(&pull).unwrap()
        ],
    );
}

/// The ETA of a running batch in the batch list of `addr`'s overview, by name.
fn overview_eta(addr: &str, name: &str) -> Option<f64> {
    let overview = api(addr, "/api/v1/overview");
    overview["in_flight"]
        .as_array()?
        .iter()
        .find(|b| b["name"] == name)?["eta_s"]
        .as_f64()
}

/// One ETA (issue 46): while a batch is sent, the send daemon's page and `forte dashboard` over
/// its catalogue show the same estimate, sampled every 5 s (the daemon works it out with what
/// only it knows, the parts on its wire, and publishes it; each view reads that one).
#[test]
fn the_send_daemon_and_the_dashboard_show_one_eta() {
    let live = LiveSite::start(Site::new(), "1MB");
    // Incompressible: some 24 s at 1 MB/s.
    let staging = live.site.root.join("staging");
    for i in 0..4 {
        write(
            &staging.join(format!("{i:03}.bin")),
            &random_bytes(6_000_000),
        );
    }
    write(&staging.join(".ready"), b"");
    std::fs::rename(&staging, live.inbox.join("slow")).unwrap();
    let dashboard = free_addr();
    let _dashboard = spawn(&args![
        "--catalog",
        &live.site.edge_catalog,
        "dashboard",
        "--http",
        &dashboard
    ]);
    assert!(wait_for(20, || http_get(&dashboard, "/api/v1", &[]).is_some()));
    // Both show one once the daemon has published its first (its rate takes a few looks).
    assert!(wait_for(30, || overview_eta(&live.edge, "slow").is_some()
        && overview_eta(&dashboard, "slow").is_some()));
    let mut samples = vec![];
    loop {
        let (daemon, viewed) = (
            overview_eta(&live.edge, "slow"),
            overview_eta(&dashboard, "slow"),
        );
        match daemon {
            // The last seconds: 10 % of them is less than two requests apart.
            Some(daemon) if daemon >= 2.0 => samples.push((daemon, viewed)),
            _ => break,
        }
        std::thread::sleep(std::time::Duration::from_secs(5));
    }
    println!("ETAs (daemon, dashboard): {samples:?}");
    assert!(samples.len() >= 2, "too few samples: {samples:?}");
    for (daemon, viewed) in &samples {
        let viewed = &viewed.unwrap_or(f64::NAN);
        assert!(
            (daemon - viewed).abs() <= 0.1 * daemon.max(*viewed),
            "the daemon says {daemon:.1} s, the dashboard {viewed:.1} s: {samples:?}"
        );
    }
}
