//! The core: what is ready to pull (a long poll waits for the next seal), a sealed batch's
//! inventory, an object's manifest and parts, a batch's delivery acknowledged (with its
//! receipt), a damaged part or manifest rejected, and the relay's metrics.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Json;
use base64::Engine;

use super::answer::blocking;
use super::request::{check_batch, core_for, object_id, part_index, principal};
use super::{body, metrics, site_metrics, Answer, Failure, Principal, Relay};
use crate::api::{BatchAck, ReadyObject, ReadyQuery, GENERATION_HEADER, MAX_WAIT_MS};

/// Prometheus metrics, for a core token (scrapers authenticate like pullers): a token limited
/// to some sites sees only theirs ([`site_metrics`]).
pub(super) async fn render_metrics(
    State(relay): State<Arc<Relay>>,
    headers: HeaderMap,
) -> Answer<String> {
    let sites = match principal(&relay, &headers)? {
        Principal::Core { sites } => sites,
        Principal::Edge { .. } => {
            return Err(Failure::new(
                StatusCode::FORBIDDEN,
                "metrics need a core token".into(),
            ))
        }
    };
    let text = metrics::render();
    if sites.iter().any(|s| s == "*") {
        return Ok(text);
    }
    site_metrics::only_sites(&text, &sites).map_err(|e| {
        // Never the whole text instead: that would show this token every site's series.
        tracing::error!("cannot cut the relay's metrics down to sites {sites:?}: {e:#}");
        Failure::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the relay cannot read its own metrics; see its log".into(),
        )
    })
}

pub(super) async fn ready(
    State(relay): State<Arc<Relay>>,
    headers: HeaderMap,
    Query(query): Query<ReadyQuery>,
) -> Answer<([(&'static str, String); 1], Json<Vec<ReadyObject>>)> {
    let core = principal(&relay, &headers)?;
    let Principal::Core { sites } = &core else {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "an edge token cannot pull".into(),
        ));
    };
    let sites = sites.clone();
    let mut seals = relay.seals.subscribe();
    if let Some(after) = query.after {
        let wait = std::time::Duration::from_millis(query.wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
        // Timing out is an answer too: the listing as it is.
        let next = seals.wait_for(|seals| seals.generation(&core) > after);
        let _ = tokio::time::timeout(wait, next).await;
    }
    // Read before listing: a seal during the listing makes the next long poll return at once.
    let generation = seals.borrow_and_update().generation(&core);
    let r = relay.clone();
    let listing = blocking(move || Ok(r.store.ready(&sites, query.open))).await?;
    Ok(([(GENERATION_HEADER, generation.to_string())], Json(listing)))
}

/// The sealed inventory of a sealed batch; 404 if the batch was sealed without one.
pub(super) async fn get_inventory(
    State(relay): State<Arc<Relay>>,
    Path((site, batch)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer<Vec<u8>> {
    core_for(&relay, &headers, &site)?;
    check_batch(&batch)?;
    let r = relay.clone();
    let b = batch.clone();
    blocking(move || r.store.read_inventory(&site, &b))
        .await?
        .ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_FOUND,
                format!("batch {batch} was sealed without an inventory"),
            )
        })
}

pub(super) async fn get_manifest(
    State(relay): State<Arc<Relay>>,
    Path((site, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer<Vec<u8>> {
    core_for(&relay, &headers, &site)?;
    let id = object_id(&id)?;
    let r = relay.clone();
    blocking(move || r.store.read_manifest(&site, id)).await
}

pub(super) async fn get_part(
    State(relay): State<Arc<Relay>>,
    Path((site, id, index)): Path<(String, String, u32)>,
    headers: HeaderMap,
) -> Answer<Response> {
    core_for(&relay, &headers, &site)?;
    let (id, index) = (object_id(&id)?, part_index(index)?);
    let r = relay.clone();
    let part = blocking(move || r.store.open_part(&site, id, index)).await?;
    Ok(body::stream_out(
        part,
        format!("part {index} of object {id}"),
    ))
}

pub(super) async fn ack_batch(
    State(relay): State<Arc<Relay>>,
    Path((site, batch)): Path<(String, String)>,
    headers: HeaderMap,
    Json(ack): Json<BatchAck>,
) -> Answer<StatusCode> {
    core_for(&relay, &headers, &site)?;
    check_batch(&batch)?;
    let r = relay.clone();
    let count = ack.objects.len() as u64;
    let b = batch.clone();
    let receipt = match ack.receipt.as_deref() {
        Some(text) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| Failure::new(StatusCode::BAD_REQUEST, format!("receipt: {e}")))?,
        ),
        None => None,
    };
    blocking(move || {
        r.store
            .ack_batch(&site, &b, &ack.objects, receipt.as_deref())
    })
    .await?;
    tracing::info!(batch = %batch, objects = count, "delivery of a batch acknowledged; objects deleted");
    ::metrics::counter!("forte_relay_objects_acknowledged_total").increment(count);
    Ok(StatusCode::NO_CONTENT)
}

/// A manifest the core could not open although it opened the batch's inventory: dropped, and
/// the object reopened for the edge to seal again.
pub(super) async fn reject_manifest(
    State(relay): State<Arc<Relay>>,
    Path((site, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer<StatusCode> {
    core_for(&relay, &headers, &site)?;
    let id = object_id(&id)?;
    let r = relay.clone();
    blocking(move || r.store.reject_manifest(&site, id)).await?;
    tracing::warn!(object = %id, "manifest reported damaged by the core; dropped");
    ::metrics::counter!("forte_relay_manifests_rejected_total").increment(1);
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn reject(
    State(relay): State<Arc<Relay>>,
    Path((site, id, index)): Path<(String, String, u32)>,
    headers: HeaderMap,
) -> Answer<StatusCode> {
    core_for(&relay, &headers, &site)?;
    let (id, index) = (object_id(&id)?, part_index(index)?);
    let r = relay.clone();
    blocking(move || r.store.reject(&site, id, index)).await?;
    tracing::warn!(object = %id, part = index, "part reported damaged by the core; dropped");
    ::metrics::counter!("forte_relay_parts_rejected_total").increment(1);
    Ok(StatusCode::NO_CONTENT)
}
