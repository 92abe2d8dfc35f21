//! The web dashboard: HTML rendered on the server from the API's answers, so every page reads
//! without JavaScript (it then reloads itself every 10 s). With JavaScript, `assets/dashboard.js`
//! keeps a page live on a stream of server-sent events (`/live/…`) whose data are the page's
//! sections rendered again by the same functions: one renderer, no second one in the browser.

use std::fmt::Write;

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use forte_catalog::{format_utc, BatchKey, FileState};
use forte_report::human;
use forte_report::kpi;
use serde::Deserialize;
use serde_json::json;

use crate::api::{self, ApiError, ApiQuery, Shared};
use crate::live::{QueueView, RelayHoldings, StageView};
use crate::model::{
    self, Alert, AlertLevel, Batch, BatchDetail, FailureView, File, Lineage, Overview, ReceiptView,
    Totals, FILL_CRITICAL, FILL_WARNING,
};

pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/", get(overview))
        .route("/history", get(history))
        .route("/batches/{*key}", get(batch))
        .route("/files/{object_id}", get(file))
        .route("/report", get(report))
        .route("/live/overview", get(live_overview))
        .route("/live/batch/{*key}", get(live_batch))
        .route("/assets/dashboard.js", get(script))
        .route("/assets/dashboard.css", get(style))
}

const SCRIPT: &str = include_str!("assets/dashboard.js");
const STYLE: &str = include_str!("assets/dashboard.css");

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// A page's filters. (A `?token=` never reaches a page: `access` exchanges it for a cookie.)
#[derive(Debug, Default, Deserialize, Clone)]
struct PageParams {
    name: Option<String>,
    state: Option<String>,
    role: Option<String>,
    /// Changed within this long before now: one of [`WITHIN`]'s names.
    within: Option<String>,
}

/// The history's time filter: a name and how far back it reaches.
const WITHIN: [(&str, &str, i64); 4] = [
    ("1h", "last hour", 3_600),
    ("24h", "last 24 hours", 86_400),
    ("7d", "last 7 days", 7 * 86_400),
    ("30d", "last 30 days", 30 * 86_400),
];

/// Renders links to the view's pages, escaped for an attribute.
struct Links;

impl Links {
    /// `path`, escaped for an attribute.
    fn to(&self, path: &str) -> String {
        escape(path)
    }

    fn batch(&self, key: &str) -> String {
        self.to(&format!("/batches/{}", escape_path(key)))
    }

    /// The batch `key` in the `catalog`-th catalogue read (two edges' may hold one id).
    fn batch_in(&self, key: &str, catalog: usize) -> String {
        self.to(&batch_path_in(key, catalog))
    }

    fn file(&self, object_id: &str) -> String {
        self.to(&format!("/files/{}", escape_path(object_id)))
    }
}

/// Text for HTML: `<`, `>`, `&` and quotes escaped.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes what is not unreserved in a query value.
pub(crate) fn escape_query(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A path segment: percent-encoded, but a batch key's slash kept.
fn escape_path(text: &str) -> String {
    text.split('/')
        .map(escape_query)
        .collect::<Vec<_>>()
        .join("/")
}

/// A query value back from its percent-encoding (and `+` for a space).
pub(crate) fn unescape_query(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(high), Some(low)) => {
                        out.push((high * 16 + low) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The whole page around `body`; `live` is the event stream that keeps it current, if any.
fn page(title: &str, links: &Links, live: Option<&str>, body: &str) -> Html<String> {
    let live_attr = live
        .map(|l| format!(" data-live=\"{}\"", links.to(l)))
        .unwrap_or_default();
    let nav = [
        ("/", "Overview"),
        ("/history", "History"),
        ("/report", "Report"),
    ]
    .iter()
    .map(|(path, label)| format!("<a href=\"{}\">{label}</a>", links.to(path)))
    .collect::<Vec<_>>()
    .join(" ");
    Html(format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · forte</title>\
         <link rel=\"icon\" href=\"data:,\">\
         <link rel=\"stylesheet\" href=\"{css}\">\
         <noscript><meta http-equiv=\"refresh\" content=\"10\"></noscript>\
         <script src=\"{js}\" defer></script></head>\
         <body{live_attr}><header><strong>forte</strong> <nav>{nav}</nav> \
         <span class=\"updated\">updated <time id=\"updated\">{now}</time> \
         <span id=\"live-state\" class=\"muted\">{static_note}</span></span></header>\
         <main><h1>{title}</h1>{body}</main></body></html>",
        title = escape(title),
        css = links.to("/assets/dashboard.css"),
        js = links.to("/assets/dashboard.js"),
        now = format_utc(forte_catalog::now_us()),
        static_note = if live.is_some() {
            "(reloads every 10 s)"
        } else {
            ""
        },
    ))
}

/// Seconds for people: `42 s`, `3 min 12 s`, `2 h 5 min`.
fn duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3_599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3_600, (s % 3_600) / 60),
    }
}

/// A rate in decimal megabytes per second, as links and forte report quote them.
fn rate(bytes_per_second: Option<f64>) -> String {
    bytes_per_second
        .map(|r| format!("{:.1} MB/s", r.max(0.0) / 1e6))
        .unwrap_or_else(|| "–".into())
}

fn progress_bar(progress: f64, state: &str) -> String {
    let percent = (100.0 * progress).clamp(0.0, 100.0);
    format!(
        "<div class=\"bar {state}\" role=\"progressbar\" aria-valuenow=\"{percent:.0}\" \
         aria-valuemin=\"0\" aria-valuemax=\"100\"><span style=\"width:{percent:.1}%\"></span></div>\
         <span class=\"percent\">{percent:.1} %</span>"
    )
}

fn totals(t: &Totals) -> String {
    format!(
        "<div class=\"tiles\"><div><b>{}</b> batches</div><div><b>{}</b> at the edge</div>\
         <div><b>{}</b> at the relay</div><div><b>{}</b> at the core</div>\
         <div><b>{}</b> delivered</div>\
         <div class=\"{}\"><b>{}</b> held back</div><div><b>{}</b> recorded</div></div>",
        t.batches,
        t.at_edge,
        t.at_relay,
        t.at_core,
        t.delivered,
        if t.held_back > 0 { "bad" } else { "" },
        t.held_back,
        human(t.bytes.max(0) as u64)
    )
}

fn alerts(alerts: &[Alert]) -> String {
    if alerts.is_empty() {
        return "<p class=\"muted\">No alerts.</p>".into();
    }
    let mut html = String::from("<ul class=\"alerts\">");
    for a in alerts {
        let class = match a.level {
            AlertLevel::Warning => "warning",
            AlertLevel::Critical => "critical",
        };
        let _ = write!(html, "<li class=\"{class}\">{}</li>", escape(&a.text));
    }
    html.push_str("</ul>");
    html
}

fn in_flight(batches: &[Batch], links: &Links) -> String {
    if batches.is_empty() {
        return "<p class=\"muted\">Nothing in flight.</p>".into();
    }
    let mut html = String::from(
        "<table><thead><tr><th>batch</th><th>site</th><th>where</th><th class=\"wide\">progress</th>\
         <th>done</th><th>rate</th><th>ETA</th></tr></thead><tbody>",
    );
    for b in batches {
        let _ = write!(
            html,
            "<tr data-key=\"{key}\" data-phase=\"{phase}\"><td><a href=\"{href}\">{name}</a></td>\
             <td>{site}</td><td class=\"state {phase}\">{where_}</td><td class=\"wide\">{bar}</td>\
             <td>{done} of {bytes}</td><td class=\"rate\">{rate}</td><td class=\"eta\">{eta}</td></tr>",
            key = escape(&b.key),
            href = links.batch_in(&b.key, b.catalog),
            name = escape(&b.name),
            site = escape(&b.site),
            phase = b.phase,
            where_ = b.phase.text(),
            bar = progress_bar(b.progress, b.phase.as_str()),
            done = human(b.done_bytes.max(0) as u64),
            bytes = human(b.bytes.max(0) as u64),
            rate = rate(b.rate_bytes_per_second),
            eta = b.eta_s.map(duration).unwrap_or_else(|| "–".into()),
        );
        if let Some(error) = &b.error {
            let _ = write!(
                html,
                "<tr class=\"error-row\"><td colspan=\"7\">{}</td></tr>",
                escape(error)
            );
        }
    }
    html.push_str("</tbody></table>");
    html
}

/// A queue's colour by back-pressure; a hand-off (a queue of one) has none.
fn fill_class(s: &StageView) -> &'static str {
    let fill = s.fill;
    if s.queue_capacity <= 1 {
        "handoff"
    } else if fill >= FILL_CRITICAL {
        "critical"
    } else if fill >= FILL_WARNING {
        "warning"
    } else {
        "ok"
    }
}

fn stages(stages: &[StageView], queue: Option<&QueueView>) -> String {
    let mut html = String::new();
    if let Some(q) = queue {
        let _ = write!(
            html,
            "<p>Admitted, not finished ({}): <b>{}</b> batches, <b>{}</b> files, <b>{}</b>.</p>",
            q.role,
            q.batches,
            q.files,
            human(q.bytes)
        );
    }
    if stages.is_empty() {
        html.push_str(
            "<p class=\"muted\">No pipeline runs here now (the daemons show their stages; \
             <code>forte dashboard</code> reads catalogues only).</p>",
        );
        return html;
    }
    html.push_str(
        "<table><thead><tr><th>node</th><th>stage</th><th class=\"wide\">queue</th><th>workers</th>\
         <th>items</th><th>in</th><th>out</th><th>busy (all workers)</th><th>service rate (a worker)</th></tr></thead><tbody>",
    );
    for s in stages {
        let class = fill_class(s);
        let _ = write!(
            html,
            "<tr data-stage=\"{stage}\"><td>{role}</td><td>{stage}</td><td class=\"wide\">\
             <div class=\"bar fill {class}\"><span style=\"width:{pct:.1}%\"></span></div> \
             <span class=\"queue-depth\">{depth}/{cap}</span></td><td>{workers}</td>\
             <td>{items} {item}s</td><td>{bin}</td><td>{bout}</td><td>{busy:.1} s</td><td>{rate}</td></tr>",
            role = s.role,
            stage = escape(s.stage),
            pct = 100.0 * s.fill,
            depth = s.queue_depth,
            cap = s.queue_capacity,
            workers = s.workers,
            items = s.items,
            item = s.item,
            bin = human(s.bytes_in),
            bout = human(s.bytes_out),
            busy = s.busy_s,
            rate = rate(Some(s.service_rate_bytes_per_second)),
        );
    }
    html.push_str("</tbody></table>");
    html
}

fn failures(failures: &[FailureView], links: &Links) -> String {
    if failures.is_empty() {
        return "<p class=\"muted\">No failures recorded.</p>".into();
    }
    let mut html = String::from(
        "<table><thead><tr><th>time</th><th>task</th><th>batch</th><th>file</th><th>error</th></tr></thead><tbody>",
    );
    for f in failures {
        let file = match &f.object_id {
            Some(id) => format!(
                "<a href=\"{}\">{}</a>{}",
                links.file(id),
                escape(&id[..id.len().min(12)]),
                f.part.map(|p| format!(" part {p}")).unwrap_or_default()
            ),
            None => "–".into(),
        };
        let _ = write!(
            html,
            "<tr class=\"failure\"><td>{}</td><td>{}</td><td><a href=\"{}\">{}</a></td><td>{file}</td>\
             <td class=\"error\">{}</td></tr>",
            format_utc(f.at_us),
            escape(&f.task),
            links.batch(&f.batch_key),
            escape(&f.batch_key),
            escape(&f.error)
        );
    }
    html.push_str("</tbody></table>");
    html
}

fn batch_table(batches: &[Batch], links: &Links) -> String {
    if batches.is_empty() {
        return "<p class=\"muted\">No batches.</p>".into();
    }
    let mut html = String::from(
        "<table><thead><tr><th>batch</th><th>site</th><th>where</th><th>files</th><th>bytes</th>\
         <th>rate</th><th>arrived</th><th>last change</th></tr></thead><tbody>",
    );
    for b in batches {
        let _ = write!(
            html,
            "<tr data-key=\"{}\" data-phase=\"{}\"><td><a href=\"{}\">{}</a></td><td>{}</td>\
             <td class=\"state {}\" title=\"{} row: {}\">{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&b.key),
            b.phase,
            links.batch_in(&b.key, b.catalog),
            escape(&b.name),
            escape(&b.site),
            b.phase,
            b.role,
            b.state,
            b.phase.text(),
            b.files,
            human(b.bytes.max(0) as u64),
            rate(b.rate_bytes_per_second),
            format_utc(b.arrived_us),
            format_utc(b.updated_us)
        );
    }
    html.push_str("</tbody></table>");
    html
}

fn file_table(files: &[File], links: &Links) -> String {
    if files.is_empty() {
        return "<p class=\"muted\">No files.</p>".into();
    }
    let mut html = String::from(
        "<table><thead><tr><th>path</th><th>node</th><th>state</th><th>size</th><th>delivered to</th>\
         <th>last change</th></tr></thead><tbody>",
    );
    for f in files {
        let _ = write!(
            html,
            "<tr><td><a href=\"{}\">{}</a></td><td>{}</td><td class=\"state {}\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            links.file(&f.object_id),
            escape(&f.path),
            BatchKey::parse(&f.batch_key).role(),
            f.state,
            state_text(f),
            human(f.size.max(0) as u64),
            escape(f.delivered_to.as_deref().unwrap_or("–")),
            format_utc(f.updated_us)
        );
    }
    html.push_str("</tbody></table>");
    html
}

/// A file's state as a row says it: one still `discovered` whose parts have started going says
/// how many are at the relay.
fn state_text(f: &File) -> String {
    match (f.state, f.parts_done) {
        (FileState::Discovered, n) if n > 0 => {
            format!(
                "uploading: {n} part{} at the relay",
                if n == 1 { "" } else { "s" }
            )
        }
        (state, _) => state.to_string(),
    }
}

/// A part of a live page: the page renders it, and so does each event.
struct Section {
    /// Its element's id.
    id: &'static str,
    html: String,
}

impl Section {
    fn new(id: &'static str, html: String) -> Self {
        Self { id, html }
    }
}

/// The overview's sections.
fn overview_sections(o: &Overview, links: &Links) -> Vec<Section> {
    vec![
        Section::new("totals", totals(&o.totals)),
        Section::new("alerts", alerts(&o.alerts)),
        Section::new("in-flight", in_flight(&o.in_flight, links)),
        Section::new("stages", stages(&o.stages, o.queue.as_ref())),
        Section::new("failures", failures(&o.failures, links)),
        Section::new("recent", batch_table(&o.recent, links)),
    ]
}

/// `sections` as `{"id": html, …, "updated": time}`: one event of a live page.
fn section_event(sections: Vec<Section>) -> String {
    let mut map = serde_json::Map::new();
    for Section { id, html } in sections {
        map.insert(id.into(), json!(html));
    }
    map.insert("updated".into(), json!(format_utc(forte_catalog::now_us())));
    serde_json::Value::Object(map).to_string()
}

fn search_form(params: &PageParams) -> String {
    let value = |v: &Option<String>| escape(v.as_deref().unwrap_or(""));
    let within: String = WITHIN
        .iter()
        .map(|(name, label, _)| {
            let selected = if params.within.as_deref() == Some(*name) {
                " selected"
            } else {
                ""
            };
            format!("<option value=\"{name}\"{selected}>{label}</option>")
        })
        .collect();
    format!(
        "<form class=\"search\" action=\"/history\" method=\"get\">\
         <label>name <input name=\"name\" value=\"{}\" placeholder=\"batch or file name\"></label> \
         <label>state <input name=\"state\" value=\"{}\" placeholder=\"e.g. failed\" size=\"10\"></label> \
         <label>node <select name=\"role\"><option value=\"\">any</option>\
         <option{}>edge</option><option{}>core</option></select></label> \
         <label>changed <select name=\"within\"><option value=\"\">any time</option>{within}</select></label> \
         <button type=\"submit\">Search</button></form>",
        value(&params.name),
        value(&params.state),
        if params.role.as_deref() == Some("edge") { " selected" } else { "" },
        if params.role.as_deref() == Some("core") { " selected" } else { "" },
    )
}

/// The relay's sections: its sites against their quota, what it holds per batch, its shares.
fn relay_sections(h: &RelayHoldings) -> Vec<Section> {
    vec![
        Section::new("relay-sites", relay_sites(h)),
        Section::new("relay-batches", relay_batches(h)),
        Section::new("relay-shares", relay_shares(h)),
    ]
}

/// Each site's holdings against its quota, and its ingress now.
fn relay_sites(h: &RelayHoldings) -> String {
    if h.sites.is_empty() {
        "<p class=\"muted\">The relay holds nothing: every batch sent has been delivered, or none was sent yet.</p>".to_owned()
    } else {
        let mut html = String::from(
            "<table><thead><tr><th>site</th><th>objects</th><th>held</th><th class=\"wide\">of its quota</th>\
             <th>quota</th><th>ingress now</th></tr></thead><tbody>",
        );
        for s in &h.sites {
            let (used, quota) = match (s.quota_used, h.quota_per_site) {
                (Some(used), Some(quota)) => (
                    progress_bar(used, if used >= FILL_CRITICAL { "failed" } else { "" }),
                    human(quota),
                ),
                _ => (String::new(), "none".into()),
            };
            let _ = write!(
                html,
                "<tr data-site=\"{site}\"><td>{site}</td><td class=\"objects\">{}</td><td class=\"bytes\">{}</td>\
                 <td class=\"wide\">{used}</td><td class=\"quota\">{quota}</td><td>{}</td></tr>",
                s.objects,
                human(s.bytes),
                rate(Some(s.rate_bytes_per_second)),
                site = escape(&s.site),
            );
        }
        html.push_str("</tbody></table>");
        html
    }
}

/// What the relay holds per site and batch.
fn relay_batches(h: &RelayHoldings) -> String {
    if h.batches.is_empty() {
        "<p class=\"muted\">No batch held.</p>".to_owned()
    } else {
        let mut html = String::from(
            "<table><thead><tr><th>site</th><th>batch</th><th>state</th><th>objects</th><th>bytes</th>\
             <th>age</th><th>last change</th></tr></thead><tbody>",
        );
        for b in &h.batches {
            let _ = write!(
                html,
                "<tr class=\"held\" data-site=\"{}\" data-batch=\"{}\" data-objects=\"{}\" data-bytes=\"{}\">\
                 <td>{}</td><td><code>{}</code></td>\
                 <td class=\"state {}\">{}</td><td class=\"objects\">{}</td><td class=\"bytes\">{}</td><td>{}</td><td>{}</td></tr>",
                escape(&b.site),
                escape(b.batch.as_deref().unwrap_or("")),
                b.objects,
                b.bytes,
                escape(&b.site),
                escape(b.batch.as_deref().unwrap_or("(not sealed into a batch yet)")),
                b.state,
                b.state,
                b.objects,
                human(b.bytes),
                duration(b.age_s as f64),
                format_utc(b.changed_us),
            );
        }
        html.push_str("</tbody></table>");
        html
    }
}

/// The fair shares in force, and what the core acknowledged.
fn relay_shares(h: &RelayHoldings) -> String {
    let s = &h.shares;
    let shares = match (s.fair, s.cap_bytes_per_second) {
        (false, _) => {
            "Fair shares are off (--no-fair-shares): sites split the ingress as TCP does."
                .to_owned()
        }
        (true, Some(cap)) => format!(
            "{} sites sending share the ingress: each is held to {}.",
            s.sites_sending,
            rate(Some(cap))
        ),
        (true, None) => format!(
            "{} site(s) sending: no share in force (shares hold once two sites send at once).",
            s.sites_sending
        ),
    };
    format!(
        "<p id=\"share-state\">{}</p><p class=\"muted\">Objects the core acknowledged and the relay deleted since it started: {}.</p>",
        escape(&shares),
        h.acknowledged_objects
    )
}

async fn relay_page(view: &Shared) -> Result<Html<String>, ApiError> {
    let links = Links;
    let holdings = api::read_relay(view).await?;
    let titles = ["Sites", "What the relay holds", "Fair shares"];
    let mut body = String::new();
    for (Section { id, html }, title) in relay_sections(&holdings).into_iter().zip(titles) {
        let _ = write!(
            body,
            "<h2>{title}</h2><section id=\"{id}\">{html}</section>"
        );
    }
    Ok(page(
        "relay overview",
        &links,
        Some("/live/overview"),
        &body,
    ))
}

async fn overview(State(view): State<Shared>) -> Result<Html<String>, ApiError> {
    if view.server == crate::Server::Relay {
        return relay_page(&view).await;
    }
    let links = Links;
    let o = api::read_overview(&view).await?;
    let mut body = String::new();
    let titles = [
        ("totals", ""),
        ("alerts", "Alerts"),
        ("in-flight", "In flight"),
        ("stages", "Stages"),
        ("failures", "Failures"),
        ("recent", "Recent batches"),
    ];
    let sections = overview_sections(&o, &links);
    for (Section { id, html }, (_, title)) in sections.iter().zip(titles) {
        if *id == "recent" {
            let _ = write!(
                body,
                "<h2>Utilisation, last hour</h2><img class=\"chart\" id=\"utilisation\" \
                 alt=\"CPU, memory, disk and network utilisation over the last hour\" src=\"{}\">",
                links.to("/api/v1/charts/utilisation.svg")
            );
            body.push_str(&search_form(&PageParams::default()));
        }
        if !title.is_empty() {
            let _ = write!(body, "<h2>{title}</h2>");
        }
        let _ = write!(body, "<section id=\"{id}\">{html}</section>");
    }
    let title = format!("{} overview", view.server.as_str());
    Ok(page(&title, &links, Some("/live/overview"), &body))
}

async fn live_overview(State(view): State<Shared>) -> Response {
    api::every_tick(view, "sections", move |view| async move {
        if view.server == crate::Server::Relay {
            return Ok(section_event(relay_sections(
                &api::read_relay(&view).await?,
            )));
        }
        let o = api::read_overview(&view).await?;
        let links = Links;
        Ok(section_event(overview_sections(&o, &links)))
    })
    .into_response()
}

async fn history(
    State(view): State<Shared>,
    ApiQuery(params): ApiQuery<PageParams>,
) -> Result<Html<String>, ApiError> {
    let links = Links;
    let since_us = WITHIN
        .iter()
        .find(|(name, _, _)| params.within.as_deref() == Some(*name))
        .map(|(_, _, seconds)| forte_catalog::now_us() - seconds * 1_000_000);
    let api_params = api::Params {
        name: params.name.clone(),
        state: params.state.clone(),
        role: params.role.clone(),
        since_us,
        limit: Some(200),
        ..Default::default()
    };
    let batch_filter = api_params.filter(api::batch_state);
    let file_filter = api_params.filter(api::file_state);
    let mut body = search_form(&params);
    match batch_filter {
        Ok(filter) => {
            let batches = api::read(&view, move |v| {
                model::batches(&v.catalogs, &filter, &v.progress)
            })
            .await?;
            let _ = write!(
                body,
                "<h2>Batches ({})</h2>{}",
                batches.len(),
                batch_table(&batches, &links)
            );
        }
        Err(ApiError(_, e)) => {
            let _ = write!(
                body,
                "<h2>Batches</h2><p class=\"muted\">{}</p>",
                escape(&e)
            );
        }
    }
    match file_filter {
        Ok(filter) => {
            let files = api::read(&view, move |v| model::files(&v.catalogs, &filter)).await?;
            let _ = write!(
                body,
                "<h2>Files ({})</h2>{}",
                files.len(),
                file_table(&files, &links)
            );
        }
        Err(ApiError(_, e)) => {
            let _ = write!(body, "<h2>Files</h2><p class=\"muted\">{}</p>", escape(&e));
        }
    }
    Ok(page("History", &links, None, &body))
}

/// A batch's sections.
fn batch_sections(d: &BatchDetail, links: &Links) -> Vec<Section> {
    let b = &d.batch;
    let mut summary = format!(
        "<dl class=\"facts\"><dt>where</dt><dd class=\"state {phase}\" id=\"phase\">{where_}</dd>\
         <dt>site</dt><dd>{site}</dd>\
         <dt>state</dt><dd class=\"state {state}\">{state}</dd>\
         <dt>node</dt><dd>{role}</dd><dt>key</dt><dd><code>{key}</code></dd>\
         <dt>files</dt><dd>{files}</dd><dt>done</dt><dd>{done} of {bytes}</dd>\
         <dt>rate</dt><dd class=\"rate\">{rate}</dd><dt>ETA</dt><dd class=\"eta\">{eta}</dd>\
         <dt>arrived</dt><dd>{arrived}</dd></dl>{bar}",
        phase = b.phase,
        where_ = b.phase.text(),
        site = escape(&b.site),
        state = b.state,
        role = b.role,
        key = escape(&b.key),
        files = b.files,
        done = human(b.done_bytes.max(0) as u64),
        bytes = human(b.bytes.max(0) as u64),
        rate = rate(b.rate_bytes_per_second),
        eta = b.eta_s.map(duration).unwrap_or_else(|| "–".into()),
        arrived = format_utc(b.arrived_us),
        bar = progress_bar(b.progress, b.state.as_str()),
    );
    if let Some(error) = &b.error {
        let _ = write!(summary, "<p class=\"error\">{}</p>", escape(error));
    }
    let mut stages = String::from(
        "<table><thead><tr><th>stage</th><th>started</th><th>ended</th><th>took</th></tr></thead><tbody>",
    );
    for s in &d.stages {
        let took = s
            .ended_us
            .map(|e| duration((e - s.started_us) as f64 / 1e6))
            .unwrap_or_else(|| "running".into());
        let _ = write!(
            stages,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{took}</td></tr>",
            s.stage,
            format_utc(s.started_us),
            s.ended_us.map(format_utc).unwrap_or_else(|| "–".into())
        );
    }
    stages.push_str("</tbody></table>");
    vec![
        Section::new("summary", summary),
        Section::new("batch-stages", stages),
        Section::new("batch-files", file_table(&d.files, links)),
        Section::new("batch-failures", failures(&d.failures, links)),
        Section::new("batch-receipts", receipts(&d.receipts)),
    ]
}

/// The core's receipts a batch page shows: what each says and how it was checked.
fn receipts(receipts: &[ReceiptView]) -> String {
    if receipts.is_empty() {
        return "<p class=\"muted\">No receipt of the core kept here yet.</p>".into();
    }
    let mut html = String::from(
        "<table><thead><tr><th>instance</th><th>sequence</th><th>outcome</th><th>files</th>\
         <th>kept at</th><th>delivered</th><th>checked</th></tr></thead><tbody>",
    );
    for r in receipts {
        let _ = write!(
            html,
            "<tr class=\"receipt\"><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td class=\"verified\">{}</td></tr>",
            escape(&r.instance),
            r.sequence,
            escape(r.outcome.as_deref().unwrap_or("–")),
            r.files.map(|n| n.to_string()).unwrap_or_else(|| "–".into()),
            escape(r.destination.as_deref().unwrap_or("–")),
            r.delivered_us.map(format_utc).unwrap_or_else(|| "–".into()),
            r.verified
        );
    }
    html.push_str("</tbody></table>");
    html
}

/// `/batches/KEY`, with `?catalog=N` when it is not the first catalogue read.
fn batch_path_in(key: &str, catalog: usize) -> String {
    match catalog {
        0 => format!("/batches/{}", escape_path(key)),
        n => format!("/batches/{}?catalog={n}", escape_path(key)),
    }
}

async fn read_batch(view: &Shared, key: &str, at: api::InCatalog) -> Result<BatchDetail, ApiError> {
    let batch_key = BatchKey::parse(key);
    let detail = api::read(view, move |v| {
        model::batch(&v.catalogs, &batch_key, at.catalog, &v.progress)
    })
    .await?;
    detail.ok_or_else(|| ApiError::not_found(format!("no catalogue here knows the batch {key}")))
}

async fn batch(
    State(view): State<Shared>,
    Path(key): Path<String>,
    ApiQuery(at): ApiQuery<api::InCatalog>,
) -> Result<Html<String>, ApiError> {
    let links = Links;
    let d = read_batch(&view, &key, at).await?;
    let mut body = String::new();
    let titles = ["", "Stages", "Files", "Failures", "Receipts"];
    for (Section { id, html }, title) in batch_sections(&d, &links).into_iter().zip(titles) {
        if !title.is_empty() {
            let _ = write!(body, "<h2>{title}</h2>");
        }
        let _ = write!(body, "<section id=\"{id}\">{html}</section>");
    }
    // The timeline draws the stages that ended (forte report's Gantt chart).
    if d.stages.iter().any(|s| s.ended_us.is_some()) {
        let _ = write!(
            body,
            "<h2>Timeline</h2><img class=\"chart\" alt=\"the batch's timeline: queued, sent, at the relay, pulled\" src=\"{}\">",
            links.to(&format!(
                "/api/v1/charts/timeline.svg?key={}",
                escape_query(&key)
            ))
        );
    } else {
        body.push_str(
            "<h2>Timeline</h2><p class=\"muted\">Drawn once the batch's send or pull has ended.</p>",
        );
    }
    let title = format!("Batch {}", d.batch.name);
    let live = match at.catalog {
        Some(n) => format!("/live/batch/{}?catalog={n}", escape_path(&key)),
        None => format!("/live/batch/{}", escape_path(&key)),
    };
    Ok(page(&title, &links, Some(&live), &body))
}

async fn live_batch(
    State(view): State<Shared>,
    Path(key): Path<String>,
    ApiQuery(at): ApiQuery<api::InCatalog>,
) -> Response {
    api::every_tick(view, "sections", move |view| {
        let key = key.clone();
        async move {
            let d = read_batch(&view, &key, at).await?;
            let links = Links;
            Ok(section_event(batch_sections(&d, &links)))
        }
    })
    .into_response()
}

async fn file(
    State(view): State<Shared>,
    Path(object_id): Path<String>,
) -> Result<Html<String>, ApiError> {
    let links = Links;
    let id = object_id.clone();
    let lineage: Lineage = api::read(&view, move |v| Lineage::read(&v.catalogs, &id)).await?;
    let Some(first) = lineage.files.first() else {
        return Err(ApiError::not_found(format!(
            "no catalogue here knows the file {object_id}"
        )));
    };
    let mut body = format!(
        "<dl class=\"facts\"><dt>object</dt><dd><code>{}</code></dd><dt>size</dt><dd>{}</dd>\
         <dt>sha256</dt><dd><code>{}</code></dd><dt>batch</dt><dd><a href=\"{}\">{}</a></dd></dl>",
        escape(&object_id),
        human(first.size.max(0) as u64),
        escape(first.sha256.as_deref().unwrap_or("–")),
        links.batch(&first.batch_key),
        escape(lineage.batch_name(&first.batch_key)),
    );
    let _ = write!(body, "<h2>Rows</h2>{}", file_table(&lineage.files, &links));
    body.push_str(
        "<h2>Lineage</h2><table id=\"lineage\"><thead><tr><th>time</th><th>node</th><th>batch</th><th>part</th>\
         <th>event</th><th>detail</th></tr></thead><tbody>",
    );
    for e in &lineage.events {
        let _ = write!(
            body,
            "<tr class=\"event\"><td>{}</td><td>{}</td><td title=\"{}\">{}</td><td>{}</td><td class=\"state {}\">{}</td><td>{}</td></tr>",
            format_utc(e.at_us),
            BatchKey::parse(&e.batch_key).role(),
            escape(&e.batch_key),
            escape(lineage.batch_name(&e.batch_key)),
            e.part.map(|p| p.to_string()).unwrap_or_else(|| "–".into()),
            escape(&e.state),
            escape(&e.state),
            escape(e.detail.as_deref().unwrap_or(""))
        );
    }
    body.push_str("</tbody></table><h2>Parts</h2><table><thead><tr><th>part</th><th>state</th><th>raw SHA-256</th><th>ciphertext SHA-256</th></tr></thead><tbody>");
    for p in &lineage.parts {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td><code>{}</code></td></tr>",
            p.index,
            p.state,
            escape(p.raw_sha256.as_deref().unwrap_or("–")),
            escape(p.ciphertext_sha256.as_deref().unwrap_or("–"))
        );
    }
    body.push_str("</tbody></table>");
    Ok(page(&format!("File {}", first.path), &links, None, &body))
}

async fn report(
    State(view): State<Shared>,
    ApiQuery(params): ApiQuery<api::Params>,
) -> Result<Html<String>, ApiError> {
    let links = Links;
    let batches = api::read_report(&view, params.report_window()?).await?;
    let body = report_body(&batches, &links);
    Ok(page("Report", &links, None, &body))
}

/// The report page's body: the run's KPIs, the batches, the late arrivals, what each symbol
/// means, and the charts. Every symbol (FORTE §2.2's) is named in words beside it.
fn report_body(batches: &[kpi::BatchKpi], links: &Links) -> String {
    let mut body = report_tiles(batches);
    body.push_str(&report_batches(batches));
    body.push_str(&report_late(batches));
    body.push_str(&report_glossary());
    let _ = write!(
        body,
        "<h2>Timeline</h2><img class=\"chart\" alt=\"every batch's timeline\" src=\"{}\">\
         <h2>Utilisation</h2><img class=\"chart\" alt=\"utilisation over the last hour\" src=\"{}\">",
        links.to("/api/v1/charts/timeline.svg"),
        links.to("/api/v1/charts/utilisation.svg"),
    );
    body
}

/// A KPI's symbol with its name beside it.
fn named(k: &forte_report::words::Kpi) -> String {
    format!("{} <span class=\"muted\">{}</span>", k.html, k.name)
}

/// The run's KPIs as tiles.
fn report_tiles(batches: &[kpi::BatchKpi]) -> String {
    use forte_report::words::{L_B, R_P};
    let Some(run) = kpi::run(batches) else {
        return "<p class=\"muted\">No batch delivered yet: no pipeline KPIs.</p>".into();
    };
    let late = match run.late_files {
        0 => String::new(),
        n => format!(
            "<div><b>{n}</b> late file{} ({}) left out</div>",
            if n == 1 { "" } else { "s" },
            human(run.late_bytes)
        ),
    };
    format!(
        "<div class=\"tiles\"><div><b>{}</b> of {} batches delivered</div>\
         <div><b>{:.1} MB/s</b> {}</div><div><b>{:.2} TB/day</b> daily capacity</div>\
         <div><b>{:.2}</b> compression ratio</div><div><b>{:.1} s</b> mean {}</div>{late}</div>",
        run.delivered,
        run.batches,
        run.rate_mb_s,
        named(&R_P),
        run.daily_capacity_bytes / 1e12,
        run.compression_ratio,
        run.mean_latency_s,
        named(&L_B)
    )
}

/// Each batch's KPIs.
fn report_batches(batches: &[kpi::BatchKpi]) -> String {
    use forte_report::words::{L_B, R_B};
    let mut body = format!(
        "<h2>Batches</h2><table><thead><tr><th>batch</th><th>raw</th><th>queued</th><th>processing</th>\
         <th>{}</th><th>{}</th></tr></thead><tbody>",
        named(&L_B),
        named(&R_B)
    );
    let opt = |v: Option<f64>, unit: &str| v.map_or("–".into(), |v| format!("{v:.1} {unit}"));
    for b in batches {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{:.1} s</td><td>{:.1} s</td><td>{}</td><td>{}</td></tr>",
            escape(&b.name),
            human(b.raw_bytes),
            b.queueing_s,
            b.processing_s,
            opt(b.latency_s, "s"),
            opt(b.rate_mb_s, "MB/s")
        );
    }
    body.push_str("</tbody></table>");
    body
}

/// The files that came after their batch was sent, each its own line.
fn report_late(batches: &[kpi::BatchKpi]) -> String {
    let late: Vec<String> = batches
        .iter()
        .flat_map(|b| b.late.iter().map(|f| escape(&f.sentence(&b.name))))
        .collect();
    if late.is_empty() {
        return String::new();
    }
    let mut body = format!(
        "<h2>Late arrivals</h2><p class=\"muted\">{}.</p><ul>",
        escape(forte_report::words::LATE_ARRIVALS)
    );
    for line in late {
        let _ = write!(body, "<li>{line}</li>");
    }
    body.push_str("</ul>");
    body
}

/// Every KPI's symbol, name and meaning.
fn report_glossary() -> String {
    use forte_report::words::{DAILY_CAPACITY, KPIS};
    let mut body = String::from("<h2>What the figures mean</h2><dl class=\"facts\">");
    for k in KPIS {
        let _ = write!(
            body,
            "<dt>{}, {}</dt><dd>{}</dd>",
            k.html,
            k.name,
            escape(k.meaning)
        );
    }
    let (capacity, meaning) = DAILY_CAPACITY
        .split_once(": ")
        .expect("a name and its meaning");
    let _ = write!(
        body,
        "<dt>queued, processing</dt><dd>seconds queued (q<sub>send</sub> + q<sub>relay</sub>) and worked on (t<sub>send</sub> + t<sub>pull</sub>)</dd>\
         <dt>{capacity}</dt><dd>{}</dd></dl>",
        escape(meaning)
    );
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_queries_round_trip() {
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        for text in ["plain", "a b+c/d?e=f&g", "é%", "%zz", "%4"] {
            assert_eq!(unescape_query(&escape_query(text)), text, "{text}");
        }
        assert_eq!(unescape_query("a+b%20c"), "a b c");
        assert_eq!(escape_path("site-a/0f 3"), "site-a/0f%203");
    }

    /// Every symbol on the report page has its name and meaning beside it, and a late file
    /// is listed on its own.
    #[test]
    fn the_report_page_names_every_symbol_and_lists_late_arrivals() {
        use forte_catalog::Stage;
        use kpi::{BatchKpi, LateFile, StageSpan};
        let span = |stage, queued_from, started, ended| StageSpan {
            stage,
            queued_from,
            started,
            ended,
        };
        let batch = BatchKpi {
            name: "run-1".into(),
            site: "site-a".into(),
            batch_id: "b1".into(),
            files: 4,
            raw_bytes: 8_000_000,
            sealed_bytes: 8_000_000,
            arrived: 0,
            stages: vec![
                span(Stage::Send, 0, 100_000, 300_000),
                span(Stage::Pull, 300_000, 400_000, 700_000),
            ],
            tasks: vec![],
            latency_s: Some(0.7),
            queueing_s: 0.2,
            processing_s: 0.5,
            rate_mb_s: Some(8.0 / 0.7),
            late: vec![LateFile {
                path: "bags/late.bag".into(),
                object_id: "o".into(),
                bytes: 100_000,
                found: 2_800_000,
                after_sent_s: 2.5,
                delivered: Some(2_950_000),
                delivered_in_s: Some(0.15),
            }],
        };
        let body = report_body(&[batch], &Links);
        // Each `X<sub>Y</sub>` on the page is one the glossary names and explains.
        let mut rest = body.as_str();
        let mut seen = 0;
        while let Some(at) = rest.find("<sub>") {
            let start = rest[..at]
                .rfind(|c: char| !c.is_ascii_alphabetic())
                .map_or(0, |i| i + 1);
            let end = at + rest[at..].find("</sub>").unwrap() + "</sub>".len();
            let html = &rest[start..end];
            let kpi = forte_report::words::KPIS
                .iter()
                .find(|k| k.html == html)
                .unwrap_or_else(|| panic!("{html} is not a KPI the page explains"));
            let words = format!(
                "<dt>{}, {}</dt><dd>{}</dd>",
                kpi.html,
                kpi.name,
                escape(kpi.meaning)
            );
            assert!(body.contains(&words), "{html} without its words: {body}");
            seen += 1;
            rest = &rest[end..];
        }
        assert!(seen >= 7, "{body}");
        assert!(
            body.contains("R<sub>P</sub> <span class=\"muted\">pipeline rate</span>"),
            "{body}"
        );
        assert!(
            body.contains("<li>bags/late.bag of run-1 arrived 2.5 s after its batch was sent, delivered in 0.1 s</li>"),
            "{body}"
        );
    }

    #[test]
    fn a_file_on_its_way_says_how_many_parts_are_at_the_relay() {
        // A file being uploaded read "discovered" until its last part was at the relay.
        let file = |state, parts_done| File {
            object_id: "o".into(),
            batch_key: "k".into(),
            path: "big.bin".into(),
            size: 100 << 20,
            state,
            sha256: None,
            delivered_to: None,
            carrier: None,
            updated_us: 0,
            parts_done,
        };
        assert_eq!(state_text(&file(FileState::Discovered, 0)), "discovered");
        assert_eq!(
            state_text(&file(FileState::Discovered, 3)),
            "uploading: 3 parts at the relay"
        );
        assert_eq!(
            state_text(&file(FileState::Discovered, 1)),
            "uploading: 1 part at the relay"
        );
        assert_eq!(state_text(&file(FileState::AtRelay, 7)), "at_relay");
    }
}
