//! What every request passes before its handler reads a byte of its body: its token, the
//! size its body announces, the memory a body held whole takes ([`super::memory`]), and for an
//! upload its site's share of the ingress ([`super::share`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::request::principal;
use super::share::SharedBody;
use super::{body, memory, Answer, Failure, Principal, Relay};
use crate::api::{MANIFEST_LENGTH_HEADER, MAX_BODY, SHARE_HEADER};

/// Runs before any handler reads a body: a request without a known token gets 401, and one
/// announcing a body over [`MAX_BODY`] gets 413, without a byte of the body being read. Only
/// authenticated sites can make the relay read a part (which it writes to disk as it arrives,
/// [`body`]); a body held whole (JSON, a manifest) takes its length from the relay's memory
/// budget first ([`memory`]). An upload's body is read at its site's share ([`super::share`]), and
/// the answer says the share when one is in force.
pub(super) async fn gate(
    State(relay): State<Arc<Relay>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let principal = match principal(&relay, request.headers()) {
        Err(refused) => return refused.into_response(),
        Ok(principal) => principal,
    };
    let holder = match &principal {
        Principal::Edge { site } => format!("site {site}"),
        Principal::Core { .. } => "the core".to_string(),
    };
    if let Some(ConnectInfo(peer)) = request.extensions().get::<ConnectInfo<SocketAddr>>() {
        relay.connections.vouch(peer.ip(), &holder);
    }
    let announced = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY as u64) {
        return Failure::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a body of at most {MAX_BODY} bytes is accepted"),
        )
        .into_response();
    }
    let stall = relay.body_stall;
    let meter = match held_in_memory(&request, announced) {
        Ok(None) => None,
        Ok(Some(HeldWhole { declared, free })) => match relay.bodies.meter(&holder, declared, free)
        {
            Ok(meter) => Some(meter),
            Err(memory::TooLarge(why)) => {
                return Failure::new(StatusCode::PAYLOAD_TOO_LARGE, why).into_response()
            }
        },
        Err(refused) => return refused.into_response(),
    };
    let out_of_room = meter.as_ref().map(memory::Meter::refused);
    let request = request.map(|b| {
        let b = axum::body::Body::new(body::Stalling::new(b, stall));
        match meter {
            Some(meter) => axum::body::Body::new(memory::MeteredBody::new(b, meter)),
            None => b,
        }
    });
    // A body that found no room in time failed its handler's read: the answer says why.
    let answer = |response: Response| match out_of_room.and_then(|why| why.lock().take()) {
        Some(why) => Failure::new(StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
        None => response,
    };
    let site = match principal {
        Principal::Edge { site } if request.method() == axum::http::Method::PUT => site,
        _ => return answer(next.run(request).await),
    };
    let shares = relay.shares.clone();
    let request = request
        .map(|body| axum::body::Body::new(SharedBody::new(body, site.clone(), shares.clone())));
    let mut response = answer(next.run(request).await);
    if let Some(cap) = shares.cap_for(&site) {
        response
            .headers_mut()
            .insert(SHARE_HEADER, axum::http::HeaderValue::from(cap as u64));
    }
    response
}

/// A body its handler holds whole in memory: its declared length, and the bytes in front
/// that the handler does not hold (a one-part object's part, before its manifest).
struct HeldWhole {
    declared: u64,
    free: u64,
}

/// How much of `request`'s body its handler holds whole in memory, as its declared length and
/// the bytes in front that it does not hold: `None` for a part (it goes to disk as it
/// arrives); a one-part object's part in front of its manifest; any other body whole, whose
/// length it must declare if it has one.
fn held_in_memory(
    request: &axum::extract::Request,
    announced: Option<u64>,
) -> Answer<Option<HeldWhole>> {
    let path = request.uri().path();
    let is_put = request.method() == axum::http::Method::PUT;
    if is_put && path.starts_with("/v1/objects/") && path.contains("/parts/") {
        return Ok(None);
    }
    let declared = match announced {
        Some(length) => length,
        None if request
            .headers()
            .contains_key(axum::http::header::TRANSFER_ENCODING) =>
        {
            return Err(Failure::new(
                StatusCode::LENGTH_REQUIRED,
                "a request body must declare its Content-Length".to_string(),
            ))
        }
        None => 0,
    };
    if is_put && path.starts_with("/v1/objects/") && path.ends_with("/whole") {
        let manifest = request
            .headers()
            .get(MANIFEST_LENGTH_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        // The handler refuses a missing or impossible length.
        let manifest = manifest.unwrap_or(0).min(declared);
        return Ok(Some(HeldWhole {
            declared,
            free: declared - manifest,
        }));
    }
    Ok(Some(HeldWhole { declared, free: 0 }))
}
