//! Which handler answers which path, and the largest body each route reads; every route
//! behind the [`super::gate`].

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};
use axum::Router;

use super::batches::{cancel_batch, get_receipts, seal_batch, whoami};
use super::gate::gate;
use super::objects::{abandon_objects, object_status, object_statuses, put_part, put_whole, seal};
use super::pull::{
    ack_batch, get_inventory, get_manifest, get_part, ready, reject, reject_manifest,
    render_metrics,
};
use super::Relay;
use crate::api::{MAX_ACK_JSON, MAX_BATCH_SEAL_JSON, MAX_BODY, MAX_SEAL_JSON, MAX_SMALL_JSON};

pub(super) fn router(relay: Arc<Relay>) -> Router {
    Router::new()
        // JSON bodies are held whole while they are parsed: each bounded by what it can hold.
        .route(
            "/v1/objects/status",
            post(object_statuses).layer(limit(MAX_SMALL_JSON)),
        )
        .route(
            "/v1/objects/abandon",
            post(abandon_objects).layer(limit(MAX_SMALL_JSON)),
        )
        .route(
            "/v1/objects/{id}",
            get(object_status).put(seal).layer(limit(MAX_SEAL_JSON)),
        )
        .route("/v1/objects/{id}/parts/{index}", put(put_part))
        .route("/v1/objects/{id}/whole", put(put_whole))
        .route(
            "/v1/batches/{batch}",
            put(seal_batch).layer(limit(MAX_BATCH_SEAL_JSON)),
        )
        .route(
            "/v1/batches/{batch}/cancel",
            post(cancel_batch).layer(limit(MAX_SMALL_JSON)),
        )
        .route("/v1/batches/{batch}/receipts", get(get_receipts))
        .route("/v1/site", get(whoami))
        .route("/v1/ready", get(ready))
        .route("/metrics", get(render_metrics))
        .route(
            "/v1/sites/{site}/batches/{batch}/inventory",
            get(get_inventory),
        )
        .route(
            "/v1/sites/{site}/batches/{batch}/ack",
            post(ack_batch).layer(limit(MAX_ACK_JSON)),
        )
        .route("/v1/sites/{site}/objects/{id}/manifest", get(get_manifest))
        .route("/v1/sites/{site}/objects/{id}/parts/{index}", get(get_part))
        .route(
            "/v1/sites/{site}/objects/{id}/parts/{index}/reject",
            post(reject).layer(limit(MAX_SMALL_JSON)),
        )
        .route(
            "/v1/sites/{site}/objects/{id}/manifest/reject",
            post(reject_manifest).layer(limit(MAX_SMALL_JSON)),
        )
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn_with_state(relay.clone(), gate))
        .with_state(relay)
}

/// The largest body a route reads (its JSON is held whole while parsed).
fn limit(bytes: usize) -> DefaultBodyLimit {
    DefaultBodyLimit::max(bytes)
}
