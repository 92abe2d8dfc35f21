//! Who a request is from (its token: an edge of a site, or the core) and the values its path
//! and headers give (object ids, batch ids, part indexes), each checked before a handler uses
//! it.

use axum::http::{HeaderMap, StatusCode};
use forte_format::ObjectId;

use super::{Answer, Failure, Principal, Relay};
use crate::api::MAX_PART_INDEX;

pub(super) fn principal(relay: &Relay, headers: &HeaderMap) -> Answer<Principal> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| Failure::new(StatusCode::UNAUTHORIZED, "missing bearer token".into()))?;
    let tokens = relay.tokens.read().clone();
    tokens
        .lookup(token)
        .ok_or_else(|| Failure::new(StatusCode::UNAUTHORIZED, "unknown token".into()))
}

pub(super) fn edge_site(relay: &Relay, headers: &HeaderMap) -> Answer<String> {
    match principal(relay, headers)? {
        Principal::Edge { site } => Ok(site),
        Principal::Core { .. } => Err(Failure::new(
            StatusCode::FORBIDDEN,
            "a core token cannot upload".into(),
        )),
    }
}

pub(super) fn core_for(relay: &Relay, headers: &HeaderMap, site: &str) -> Answer<()> {
    let who = principal(relay, headers)?;
    if !crate::api::valid_site(site) {
        // Site names become directory names: nothing like `..` gets that far.
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!("{site:?} is not a site name"),
        ));
    }
    if who.pulls(site) {
        Ok(())
    } else {
        // Not 403: a token must not learn which other sites exist.
        Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("no site {site} for this token"),
        ))
    }
}

pub(super) fn object_id(text: &str) -> Answer<ObjectId> {
    text.parse()
        .map_err(|e: String| Failure::new(StatusCode::BAD_REQUEST, e))
}

/// Refuses a batch id the store could not use as a file name.
pub(super) fn check_batch(batch: &str) -> Answer<()> {
    if crate::api::valid_batch(batch) {
        Ok(())
    } else {
        Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!("batch id {batch:?} is not valid"),
        ))
    }
}

pub(super) fn part_index(index: u32) -> Answer<u32> {
    if index > MAX_PART_INDEX {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!("part index {index} is out of range"),
        ));
    }
    Ok(index)
}

/// A header the request cannot do without.
pub(super) fn required_header(headers: &HeaderMap, name: &str) -> Result<String, Failure> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| Failure::new(StatusCode::BAD_REQUEST, format!("missing {name} header")))
}
