//! What a handler answers when it refuses ([`Failure`]: a status and a JSON body saying why,
//! a store's refusal as its HTTP status), and blocking store work run off the async workers.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::store::StoreError;
use crate::api::{ApiError, ObjectState};

/// An error answer: a status and a JSON body that says what and why, and for an upload or
/// seal refused because the relay holds the object already (sealed, or delivered), in which
/// state: the edge then asks the relay what it holds instead of failing the batch.
pub(super) struct Failure {
    status: StatusCode,
    message: String,
    held: Option<ObjectState>,
}

impl Failure {
    pub(super) fn new(status: StatusCode, message: String) -> Self {
        Self {
            status,
            message,
            held: None,
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let Failure {
            status,
            message,
            held,
        } = self;
        ::metrics::counter!("forte_relay_refused_total", "status" => status.as_u16().to_string())
            .increment(1);
        if status == StatusCode::NOT_FOUND {
            // Asking about objects the relay does not hold is routine (resume, status).
            tracing::debug!(status = 404, "{message}");
        } else if status != StatusCode::INTERNAL_SERVER_ERROR {
            // Logged with its detail where it arose (`internal_error`).
            tracing::warn!(status = status.as_u16(), "refused: {message}");
        }
        let body = ApiError {
            error: message,
            held,
        };
        let mut r = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert("www-authenticate", "Bearer".parse().expect("valid header"));
            // A connection that sent no valid token is not kept for its next request: without
            // this, tokenless requests every few seconds held connections open for good.
            r.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        r
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(m) => Failure::new(StatusCode::NOT_FOUND, m),
            StoreError::Conflict(m) => Failure::new(StatusCode::CONFLICT, m),
            StoreError::Held(state, message) => Failure {
                status: StatusCode::CONFLICT,
                message,
                held: Some(state),
            },
            StoreError::Invalid(m) => Failure::new(StatusCode::UNPROCESSABLE_ENTITY, m),
            StoreError::Full(m) => Failure::new(StatusCode::INSUFFICIENT_STORAGE, m),
            // Not worth retrying: nothing will free the space unless someone acts.
            StoreError::NoRoom(m) => Failure::new(StatusCode::PAYLOAD_TOO_LARGE, m),
            StoreError::Io(m) => internal_error(&m),
        }
    }
}

/// What a client is told when the relay itself failed (its disk, a worker): nothing of the
/// relay's file system. The full detail goes to the relay's log only.
const INTERNAL_ERROR: &str = "relay storage error; see the relay's log";

pub(super) fn internal_error(detail: &str) -> Failure {
    tracing::error!(status = 500, "storage error: {detail}");
    Failure::new(StatusCode::INTERNAL_SERVER_ERROR, INTERNAL_ERROR.into())
}

pub(super) type Answer<T> = std::result::Result<T, Failure>;

/// Runs blocking store work (disk, hashing) off the async workers.
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::result::Result<T, StoreError> + Send + 'static,
) -> Answer<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| internal_error(&format!("worker failed: {e}")))?
        .map_err(Failure::from)
}
