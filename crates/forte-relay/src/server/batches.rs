//! The edge's batches: a batch sealed (waiting, if asked, for its last objects still on the
//! way), a batch cancelled, the core's receipts for one, and the site the edge's token
//! belongs to.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use base64::Engine;
use forte_format::ObjectId;

use super::answer::blocking;
use super::request::{check_batch, edge_site};
use super::{Answer, Failure, Relay};
use crate::api::{BatchAck, BatchSeal, BatchSealQuery, Receipts, SiteAnswer, MAX_WAIT_MS};

pub(super) async fn seal_batch(
    State(relay): State<Arc<Relay>>,
    Path(batch): Path<String>,
    Query(query): Query<BatchSealQuery>,
    headers: HeaderMap,
    Json(seal): Json<BatchSeal>,
) -> Answer<StatusCode> {
    let site = edge_site(&relay, &headers)?;
    check_batch(&batch)?;
    let inventory = match &seal.inventory {
        Some(text) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|_| {
                    Failure::new(
                        StatusCode::BAD_REQUEST,
                        format!("the inventory of batch {batch} is not base64"),
                    )
                })?,
        ),
        None => None,
    };
    let objects = seal.objects;
    let count = objects.len();
    // After a wait that saw every object sealed or delivered, they need not be looked at again.
    let present = match query.wait_ms {
        Some(wait) => wait_for_members(&relay, &site, &batch, &objects, wait).await?,
        None => false,
    };
    let (r, s, b) = (relay.clone(), site.clone(), batch.clone());
    blocking(move || {
        let inventory = inventory.as_deref();
        match present {
            true => r.store.write_batch_seal(&s, &b, &objects, inventory),
            false => r.store.seal_batch(&s, &b, &objects, inventory),
        }
    })
    .await?;
    relay.sealed_something(&site);
    tracing::info!(batch = %batch, objects = count, "batch sealed");
    ::metrics::counter!("forte_relay_batches_sealed_total").increment(1);
    Ok(StatusCode::CREATED)
}

/// Waits up to `wait_ms` (at most [`MAX_WAIT_MS`]) until every one of `objects` is sealed or
/// delivered: an edge seals a batch while its last objects are still crossing the link, so
/// that the seal does not wait a round trip after them. Whether none is missing at the end;
/// after the first look only the missing ones are looked at again.
async fn wait_for_members(
    relay: &Arc<Relay>,
    site: &str,
    batch: &str,
    objects: &[ObjectId],
    wait_ms: u64,
) -> Result<bool, Failure> {
    let deadline =
        tokio::time::Instant::now() + std::time::Duration::from_millis(wait_ms.min(MAX_WAIT_MS));
    let mut seals = relay.seals.subscribe();
    let mut waiting = objects.to_vec();
    let mut first = true;
    loop {
        // Marked seen before looking, so that a seal during the look wakes the next wait.
        seals.borrow_and_update();
        let (r, site) = (relay.clone(), site.to_string());
        waiting = blocking(move || Ok(r.store.unsealed(&site, &waiting))).await?;
        if waiting.is_empty() {
            return Ok(true);
        }
        if std::mem::take(&mut first) {
            let objects = waiting.len();
            tracing::info!(batch = %batch, objects, "batch seal waits for objects on the way");
        }
        // Timing out is an answer too: the seal then names what is missing.
        if tokio::time::timeout_at(deadline, seals.changed())
            .await
            .is_err()
        {
            return Ok(false);
        }
    }
}

/// The edge cancels one of its batches: the listed objects (open or sealed, not delivered)
/// and the batch's seal are deleted, so the core never gets it.
pub(super) async fn cancel_batch(
    State(relay): State<Arc<Relay>>,
    Path(batch): Path<String>,
    headers: HeaderMap,
    Json(cancel): Json<BatchAck>,
) -> Answer<Json<crate::api::Cancelled>> {
    let site = edge_site(&relay, &headers)?;
    check_batch(&batch)?;
    let r = relay.clone();
    let b = batch.clone();
    let (objects, bytes) = blocking(move || r.store.cancel(&site, &b, &cancel.objects)).await?;
    tracing::info!(batch = %batch, objects, bytes, "batch cancelled by its edge");
    Ok(Json(crate::api::Cancelled { objects, bytes }))
}

/// The site an edge token belongs to: what `send` signs into its inventories when no `--site`
/// says otherwise.
pub(super) async fn whoami(
    State(relay): State<Arc<Relay>>,
    headers: HeaderMap,
) -> Answer<Json<SiteAnswer>> {
    let site = edge_site(&relay, &headers)?;
    Ok(Json(SiteAnswer { site }))
}

/// The core's receipts for one of this edge's batches, for the edge to verify before it
/// deletes anything.
pub(super) async fn get_receipts(
    State(relay): State<Arc<Relay>>,
    Path(batch): Path<String>,
    headers: HeaderMap,
) -> Answer<Json<Receipts>> {
    let site = edge_site(&relay, &headers)?;
    check_batch(&batch)?;
    let r = relay.clone();
    let receipts = blocking(move || r.store.receipts(&site, &batch)).await?;
    let receipts = receipts
        .iter()
        .map(|r| base64::engine::general_purpose::STANDARD.encode(r))
        .collect();
    Ok(Json(Receipts { receipts }))
}
