//! The edge's objects: a part streamed to the store as it arrives, a one-part object stored
//! and sealed in one request, an object sealed, and what the relay holds of one or many.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use base64::Engine;
use forte_format::ObjectId;

use super::answer::blocking;
use super::request::{check_batch, edge_site, object_id, part_index, required_header};
use super::store::Stored;
use super::{body, Answer, Failure, Relay};
use crate::api::{
    ObjectStatus, Seal, StatusQuery, WholeQuery, MANIFEST_LENGTH_HEADER, MAX_SEAL_JSON,
    MAX_STATUS_QUERY, SHA256_HEADER,
};

/// A part, written to the store as it arrives ([`body`]): its declared length is charged to
/// the site's quota before a byte of it is read.
pub(super) async fn put_part(
    State(relay): State<Arc<Relay>>,
    Path((id, index)): Path<(String, u32)>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Answer<StatusCode> {
    let site = edge_site(&relay, &headers)?;
    let (id, index) = (object_id(&id)?, part_index(index)?);
    let sha256 = required_header(&headers, SHA256_HEADER)?;
    let length = body::declared_length(&headers)?;
    let r = relay.clone();
    let stored = body::with_body(body, move |chunks| {
        let mut upload = r.store.begin_part(&site, id, index, &sha256, length)?;
        for chunk in chunks {
            upload.write(&chunk)?;
        }
        upload.finish()
    })
    .await?;
    Ok(part_stored(stored, id, index, length))
}

/// Logs and counts a part the store took; the answer for it.
fn part_stored(stored: Stored, id: ObjectId, index: u32, length: u64) -> StatusCode {
    match stored {
        Stored::New => {
            tracing::info!(object = %id, part = index, "part stored");
            ::metrics::counter!("forte_relay_parts_stored_total").increment(1);
            ::metrics::counter!("forte_relay_part_bytes_total").increment(length);
            StatusCode::CREATED
        }
        Stored::AlreadyHeld => {
            ::metrics::counter!("forte_relay_parts_already_held_total").increment(1);
            StatusCode::OK
        }
    }
}

/// Wakes the long polls and logs and counts an object of `site` sealed.
fn object_sealed(relay: &Relay, site: &str, id: ObjectId) {
    relay.sealed_something(site);
    tracing::info!(object = %id, "object sealed");
    ::metrics::counter!("forte_relay_objects_sealed_total").increment(1);
}

/// A one-part object stored and sealed in one request: its part, then its manifest
/// ([`MANIFEST_LENGTH_HEADER`]). The same checks as the two requests it replaces.
pub(super) async fn put_whole(
    State(relay): State<Arc<Relay>>,
    Path(id): Path<String>,
    Query(query): Query<WholeQuery>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Answer<StatusCode> {
    let site = edge_site(&relay, &headers)?;
    let id = object_id(&id)?;
    check_batch(&query.batch)?;
    let sha256 = required_header(&headers, SHA256_HEADER)?;
    let length = body::declared_length(&headers)?;
    let manifest_len = required_header(&headers, MANIFEST_LENGTH_HEADER)?
        .parse::<u64>()
        .ok()
        .filter(|&n| n <= length && n <= MAX_SEAL_JSON as u64)
        .ok_or_else(|| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                format!("{MANIFEST_LENGTH_HEADER} is not a length within the body (and at most {MAX_SEAL_JSON} bytes)"),
            )
        })?;
    let part_len = length - manifest_len;
    let (r, s) = (relay.clone(), site.clone());
    let stored = body::with_body(body, move |chunks| {
        let mut upload = r.store.begin_part(&s, id, 0, &sha256, part_len)?;
        let mut manifest = Vec::with_capacity(manifest_len as usize);
        let mut to_part = part_len;
        for mut chunk in chunks {
            let into_part = chunk.split_to((to_part as usize).min(chunk.len()));
            to_part -= into_part.len() as u64;
            upload.write(&into_part)?;
            manifest.extend_from_slice(&chunk);
        }
        r.store.put_whole(upload, &query.batch, &manifest)
    })
    .await?;
    part_stored(stored, id, 0, part_len);
    object_sealed(&relay, &site, id);
    Ok(StatusCode::CREATED)
}

pub(super) async fn object_status(
    State(relay): State<Arc<Relay>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Answer<Json<ObjectStatus>> {
    let site = edge_site(&relay, &headers)?;
    let id = object_id(&id)?;
    let r = relay.clone();
    Ok(Json(blocking(move || r.store.status(&site, id)).await?))
}

/// `POST /v1/objects/abandon`: the edge gives up open uploads of its site (never sealed);
/// their parts go now rather than at `--expire-open-after`.
pub(super) async fn abandon_objects(
    State(relay): State<Arc<Relay>>,
    headers: HeaderMap,
    Json(query): Json<StatusQuery>,
) -> Answer<Json<crate::api::Cancelled>> {
    let site = edge_site(&relay, &headers)?;
    if query.ids.len() > MAX_STATUS_QUERY {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!("at most {MAX_STATUS_QUERY} ids per request"),
        ));
    }
    let r = relay.clone();
    let (objects, bytes) = blocking(move || r.store.abandon_open(&site, &query.ids)).await?;
    tracing::info!(objects, bytes, "open uploads abandoned by their edge");
    Ok(Json(crate::api::Cancelled { objects, bytes }))
}

pub(super) async fn object_statuses(
    State(relay): State<Arc<Relay>>,
    headers: HeaderMap,
    Json(query): Json<StatusQuery>,
) -> Answer<Json<std::collections::BTreeMap<String, ObjectStatus>>> {
    let site = edge_site(&relay, &headers)?;
    if query.ids.len() > MAX_STATUS_QUERY {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!("at most {MAX_STATUS_QUERY} ids per status query"),
        ));
    }
    let asked = query.ids.len();
    let r = relay.clone();
    let answer: std::collections::BTreeMap<_, _> = blocking(move || {
        let found = r.store.statuses(&site, &query.ids)?;
        Ok(found
            .into_iter()
            .map(|(id, s)| (id.to_string(), s))
            .collect())
    })
    .await?;
    // An empty query only opens a connection (the edge's workers do so before a pass).
    if asked > 0 {
        tracing::info!(objects = asked, held = answer.len(), "status asked");
    }
    Ok(Json(answer))
}

pub(super) async fn seal(
    State(relay): State<Arc<Relay>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(seal): Json<Seal>,
) -> Answer<StatusCode> {
    let site = edge_site(&relay, &headers)?;
    let id = object_id(&id)?;
    check_batch(&seal.batch)?;
    let manifest = base64::engine::general_purpose::STANDARD
        .decode(&seal.manifest)
        .map_err(|e| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                format!("manifest is not base64: {e}"),
            )
        })?;
    let (r, s) = (relay.clone(), site.clone());
    blocking(move || r.store.seal(&s, id, &seal.batch, &seal.parts, &manifest)).await?;
    object_sealed(&relay, &site, id);
    Ok(StatusCode::CREATED)
}
