//! The JSON endpoints of docs/api.md, the event stream, the charts and `/metrics`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use forte_catalog::{BatchKey, BatchState, FileState, Filter, Role};
use forte_report::chart::{timeline_svg, utilisation_svg, TimeAxis};
use forte_report::kpi;
use serde::Deserialize;
use serde_json::json;

use crate::model::{self, Overview};
use crate::View;

pub(crate) type Shared = Arc<View>;

pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/api/v1", get(info))
        .route("/api/v1/batches", get(batches))
        .route("/api/v1/batches/{*key}", get(batch))
        .route("/api/v1/files", get(files))
        .route("/api/v1/files/{object_id}", get(lineage))
        .route("/api/v1/kpis", get(kpis))
        .route("/api/v1/stages", get(stages))
        .route("/api/v1/usage", get(usage))
        .route("/api/v1/failures", get(failures))
        .route("/api/v1/overview", get(overview))
        .route("/api/v1/relay", get(relay))
        .route("/api/v1/events", get(events))
        .route("/api/v1/charts/timeline.svg", get(timeline_chart))
        .route("/api/v1/charts/utilisation.svg", get(utilisation_chart))
}

/// An answer that is not the one asked for: its status and `{"error": …}`.
pub(crate) struct ApiError(pub StatusCode, pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl ApiError {
    fn bad(text: String) -> Self {
        Self(StatusCode::BAD_REQUEST, text)
    }

    pub(crate) fn not_found(text: String) -> Self {
        Self(StatusCode::NOT_FOUND, text)
    }
}

/// Query parameters, or a 400 whose `{"error": …}` names the one that is not understood.
pub(crate) struct ApiQuery<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(Self(value)),
            Err(e) => Err(ApiError::bad(e.body_text())),
        }
    }
}

/// What answers a path nothing serves: a 404 that says where the endpoints are.
pub(crate) async fn no_such_path(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!(
        "nothing is served at {}: the API's endpoints are under /api/v1 (docs/api.md), the dashboard at /",
        uri.path()
    ))
}

/// Runs `read` on a blocking thread (the catalogue's API blocks).
pub(crate) async fn read<T: Send + 'static>(
    view: &Shared,
    read: impl FnOnce(&View) -> Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let view = Arc::clone(view);
    match tokio::task::spawn_blocking(move || read(&view)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot read the catalogue: {e:#}"),
        )),
        Err(e) => Err(ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the read failed: {e}"),
        )),
    }
}

/// The query parameters of the listings (and `token`, which [`crate::access`] reads).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Params {
    pub name: Option<String>,
    pub pattern: Option<String>,
    pub site: Option<String>,
    pub state: Option<String>,
    pub role: Option<String>,
    pub since_us: Option<i64>,
    pub until_us: Option<i64>,
    pub limit: Option<i64>,
    pub key: Option<String>,
}

const DEFAULT_LIMIT: i64 = 200;
const MOST: i64 = 10_000;

impl Params {
    /// The catalogue filter these parameters say, `states` deciding which states are valid.
    pub(crate) fn filter(&self, valid_state: fn(&str) -> bool) -> Result<Filter, ApiError> {
        for (name, text) in [
            ("name", &self.name),
            ("pattern", &self.pattern),
            ("site", &self.site),
        ] {
            check_text(name, text.as_deref())?;
        }
        let state = match self.state.as_deref().filter(|s| !s.is_empty()) {
            Some(state) if valid_state(state) => Some(state.to_owned()),
            Some(state) => {
                return Err(ApiError::bad(format!(
                    "state: no state is called {state:?}"
                )))
            }
            None => None,
        };
        let role = match self.role.as_deref().filter(|r| !r.is_empty()) {
            Some(role) => Some(Role::parse(role).ok_or_else(|| {
                ApiError::bad(format!("role: {role:?} is neither edge nor core"))
            })?),
            None => None,
        };
        let limit = self.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MOST).contains(&limit) {
            return Err(ApiError::bad(format!(
                "limit: {limit} is not between 1 and {MOST}"
            )));
        }
        Ok(Filter {
            name: self.name.clone().filter(|n| !n.is_empty()),
            pattern: self.pattern.clone().filter(|p| !p.is_empty()),
            site: self.site.clone().filter(|s| !s.is_empty()),
            state,
            role,
            since: self.since_us,
            until: self.until_us,
            limit: Some(limit),
            batch: None,
        })
    }
}

/// Longest text a filter takes: names and paths are far shorter, and the database refuses a
/// pattern past some length with an error that is not the caller's to read.
const LONGEST_FILTER: usize = 1_000;

/// A 400 for a text filter too long, or with a NUL (which the database would cut it at).
fn check_text(name: &str, text: Option<&str>) -> Result<(), ApiError> {
    match text {
        Some(t) if t.len() > LONGEST_FILTER => Err(ApiError::bad(format!(
            "{name}: {} bytes, at most {LONGEST_FILTER}",
            t.len()
        ))),
        Some(t) if t.contains('\0') => Err(ApiError::bad(format!("{name}: contains a NUL byte"))),
        _ => Ok(()),
    }
}

pub(crate) fn batch_state(text: &str) -> bool {
    BatchState::parse(text).is_some()
}

pub(crate) fn file_state(text: &str) -> bool {
    FileState::parse(text).is_some()
}

async fn info(State(view): State<Shared>) -> Json<serde_json::Value> {
    let catalogs: Vec<String> = view.catalogs.iter().map(|c| c.url().to_owned()).collect();
    Json(json!({
        "api": 1,
        "forte": env!("CARGO_PKG_VERSION"),
        "role": view.server.as_str(),
        "catalogs": catalogs,
    }))
}

async fn batches(
    State(view): State<Shared>,
    ApiQuery(params): ApiQuery<Params>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let filter = params.filter(batch_state)?;
    let batches = read(&view, move |v| {
        model::batches(&v.catalogs, &filter, &v.progress)
    })
    .await?;
    Ok(Json(json!({ "batches": batches })))
}

/// `?catalog=N`: which of the catalogues read to look in for a batch (their order in
/// `GET /api/v1`); without it, the first that knows it.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
pub(crate) struct InCatalog {
    pub catalog: Option<usize>,
}

async fn batch(
    State(view): State<Shared>,
    Path(key): Path<String>,
    ApiQuery(at): ApiQuery<InCatalog>,
) -> Result<Json<model::BatchDetail>, ApiError> {
    let batch_key = BatchKey::parse(&key);
    let detail = read(&view, move |v| {
        model::batch(&v.catalogs, &batch_key, at.catalog, &v.progress)
    })
    .await?;
    detail
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no catalogue here knows the batch {key}")))
}

async fn files(
    State(view): State<Shared>,
    ApiQuery(params): ApiQuery<Params>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let filter = params.filter(file_state)?;
    let files = read(&view, move |v| model::files(&v.catalogs, &filter)).await?;
    Ok(Json(json!({ "files": files })))
}

async fn lineage(
    State(view): State<Shared>,
    Path(object_id): Path<String>,
) -> Result<Json<model::Lineage>, ApiError> {
    let id = object_id.clone();
    let lineage = read(&view, move |v| model::Lineage::read(&v.catalogs, &id)).await?;
    if lineage.files.is_empty() {
        return Err(ApiError::not_found(format!(
            "no catalogue here knows the file {object_id}"
        )));
    }
    Ok(Json(lineage))
}

/// The report's KPIs over every catalogue, of the batches `window` covers.
pub(crate) fn report(view: &View, window: &kpi::ReportWindow) -> Result<Vec<kpi::BatchKpi>> {
    let mut rows = vec![];
    for catalog in &view.catalogs {
        rows.extend(kpi::batch_rows(catalog, window)?);
    }
    if let Some(site) = &window.site {
        rows = kpi::of_site(rows, site);
    }
    Ok(kpi::batches(&rows))
}

impl Params {
    /// The report's window these parameters say: `since_us` (the last day by default),
    /// `until_us`, `site`.
    pub(crate) fn report_window(&self) -> Result<kpi::ReportWindow, ApiError> {
        check_text("site", self.site.as_deref())?;
        Ok(kpi::ReportWindow {
            since: Some(self.since_us.unwrap_or_else(model::day_ago)),
            until: self.until_us,
            site: self.site.clone().filter(|s| !s.is_empty()),
        })
    }
}

/// The KPIs of the batches `window` covers, read off the async runtime.
pub(crate) async fn read_report(
    view: &Shared,
    window: kpi::ReportWindow,
) -> Result<Vec<kpi::BatchKpi>, ApiError> {
    read(view, move |v| report(v, &window)).await
}

async fn kpis(
    State(view): State<Shared>,
    ApiQuery(params): ApiQuery<Params>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let batches = read_report(&view, params.report_window()?).await?;
    let run = kpi::run(&batches);
    Ok(Json(json!({ "batches": batches, "run": run })))
}

async fn stages(State(view): State<Shared>) -> Json<serde_json::Value> {
    Json(json!({ "stages": view.stages(), "queue": view.queue() }))
}

async fn usage(
    State(view): State<Shared>,
    ApiQuery(params): ApiQuery<Params>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let since = params.since_us.unwrap_or_else(model::hour_ago);
    let samples = read(&view, move |v| model::usage(&v.catalogs, since)).await?;
    let samples: Vec<model::UsageView> = samples.into_iter().map(Into::into).collect();
    Ok(Json(json!({ "samples": samples })))
}

async fn failures(
    State(view): State<Shared>,
    ApiQuery(params): ApiQuery<Params>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let limit = params.limit.unwrap_or(50).clamp(1, MOST);
    let failures = read(&view, move |v| model::failures(&v.catalogs, limit)).await?;
    Ok(Json(json!({ "failures": failures })))
}

pub(crate) async fn read_overview(view: &Shared) -> Result<Overview, ApiError> {
    read(view, |v| {
        Overview::read(&v.catalogs, v.stages(), v.queue(), v.wire(), &v.progress)
    })
    .await
}

/// What the relay holds now (its store is listed: that blocks); a 404 on other servers.
pub(crate) async fn read_relay(view: &Shared) -> Result<crate::RelayHoldings, ApiError> {
    read(view, |v| Ok(v.live.as_ref().and_then(|l| l.relay())))
        .await?
        .ok_or_else(|| {
            ApiError::not_found(
                "only a relay (forte relay --http) serves what it holds, and its store could not be read (see its log)".into(),
            )
        })
}

async fn relay(State(view): State<Shared>) -> Result<Json<crate::RelayHoldings>, ApiError> {
    Ok(Json(read_relay(&view).await?))
}

async fn overview(State(view): State<Shared>) -> Result<Json<Overview>, ApiError> {
    Ok(Json(read_overview(&view).await?))
}

/// How often the event stream sends the overview.
pub(crate) const TICK: Duration = Duration::from_secs(1);

/// A stream of `name` events, one now and then one every [`TICK`], each made by `make`.
pub(crate) fn every_tick<F, Fut>(
    view: Shared,
    name: &'static str,
    make: F,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>>
where
    F: Fn(Shared) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<String, ApiError>> + Send + 'static,
{
    let stream = futures_util::stream::unfold((view, true), move |(view, first)| {
        let made = make(Arc::clone(&view));
        async move {
            if !first {
                tokio::time::sleep(TICK).await;
            }
            let event = match made.await {
                Ok(data) => Event::default().event(name).data(data),
                Err(ApiError(_, error)) => Event::default()
                    .event("error")
                    .data(json!({ "error": error }).to_string()),
            };
            Some((Ok(event), (view, false)))
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

async fn events(State(view): State<Shared>) -> impl IntoResponse {
    every_tick(view, "overview", |view| async move {
        let overview = read_overview(&view).await?;
        Ok(serde_json::to_string(&overview).expect("an overview serialises"))
    })
}

fn svg(text: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

async fn timeline_chart(
    State(view): State<Shared>,
    ApiQuery(params): ApiQuery<Params>,
) -> Result<Response, ApiError> {
    let key = params.key.clone();
    let mut batches = read_report(&view, params.report_window()?).await?;
    if let Some(key) = key.filter(|k| !k.is_empty()) {
        let id = BatchKey::parse(&key).batch().to_owned();
        batches.retain(|b| b.batch_id == id);
    }
    let time = TimeAxis::of_report(&batches, &[], &[]);
    Ok(svg(timeline_svg("batch timeline", &batches, time)))
}

async fn utilisation_chart(
    State(view): State<Shared>,
    ApiQuery(params): ApiQuery<Params>,
) -> Result<Response, ApiError> {
    let since = params.since_us.unwrap_or_else(model::hour_ago);
    let samples = read(&view, move |v| model::usage(&v.catalogs, since)).await?;
    let time = TimeAxis::of_report(&[], &samples, &[]);
    Ok(svg(utilisation_svg(
        "utilisation (1 Hz samples)",
        &samples,
        time,
    )))
}

pub(crate) async fn metrics(State(view): State<Shared>) -> Response {
    match view.live.as_ref().and_then(|l| l.metrics()) {
        Some(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        None => ApiError::not_found("this server keeps no metrics".into()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A filter the database would refuse (SQLite: "LIKE or GLOB pattern too complex" past
    /// 50 000 characters, a 500) or cut at a NUL is the caller's mistake: a 400 that says so
    /// (found by the review of issue 46).
    #[test]
    fn a_text_filter_too_long_or_with_a_nul_is_refused() {
        let long = Params {
            pattern: Some("a".repeat(LONGEST_FILTER + 1)),
            ..Params::default()
        };
        let ApiError(status, text) = long.filter(batch_state).unwrap_err();
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(text.starts_with("pattern: 1001 bytes"), "{text}");
        let nul = Params {
            name: Some("run-1\0zzz".into()),
            ..Params::default()
        };
        assert!(nul.filter(batch_state).unwrap_err().1.contains("NUL"));
        let fine = Params {
            site: Some("site-a".into()),
            ..Params::default()
        };
        let Ok(filter) = fine.filter(batch_state) else {
            panic!("a site is a filter")
        };
        assert_eq!(filter.site.as_deref(), Some("site-a"));
    }
}
