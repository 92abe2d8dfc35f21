//! Who may read: a request from this machine's loopback, or one carrying the token
//! (`Authorization: Bearer TOKEN`, or `?token=TOKEN` for a browser's page and event stream).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

/// The token other hosts must show; none: loopback only.
#[derive(Clone, Default)]
pub struct Access {
    pub token: Option<Arc<str>>,
}

impl Access {
    /// Whether a request from `peer` that shows `shown` may read.
    fn allows(&self, peer: &SocketAddr, shown: Option<&str>) -> Result<(), (StatusCode, String)> {
        if peer.ip().is_loopback() {
            return Ok(());
        }
        let Some(token) = &self.token else {
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "{} is not this machine: forte serves other hosts only with a token \
                     (start it with --http-token-file FILE and send Authorization: Bearer TOKEN)",
                    peer.ip()
                ),
            ));
        };
        match shown {
            Some(shown) if bool::from(shown.as_bytes().ct_eq(token.as_bytes())) => Ok(()),
            Some(_) => Err((
                StatusCode::UNAUTHORIZED,
                "the token is not the one in forte's --http-token-file".into(),
            )),
            None => Err((
                StatusCode::UNAUTHORIZED,
                "a request from another host needs the token of forte's --http-token-file \
                 (Authorization: Bearer TOKEN, or ?token=TOKEN on a page's address)"
                    .into(),
            )),
        }
    }
}

/// The token a request shows: its bearer token, or its `token` query parameter.
fn shown(request: &Request) -> Option<String> {
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    bearer.or_else(|| {
        request.uri().query().and_then(|q| {
            q.split('&')
                .filter_map(|pair| pair.split_once('='))
                .find(|(k, _)| *k == "token")
                .map(|(_, v)| crate::pages::unescape_query(v))
        })
    })
}

/// Refuses what [`Access::allows`] does not allow, with the reason as `{"error": …}`.
pub async fn check(
    State(access): State<Access>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    match access.allows(&peer, shown(&request).as_deref()) {
        Ok(()) => next.run(request).await,
        Err((status, error)) => {
            (status, axum::Json(serde_json::json!({ "error": error }))).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_reads_and_other_hosts_need_the_token() {
        let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let local6: SocketAddr = "[::1]:5000".parse().unwrap();
        let other: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        let open = Access::default();
        assert!(open.allows(&local, None).is_ok());
        assert!(open.allows(&local6, None).is_ok());
        assert_eq!(
            open.allows(&other, Some("x")).unwrap_err().0,
            StatusCode::FORBIDDEN
        );
        let guarded = Access {
            token: Some("s3cret".into()),
        };
        assert_eq!(
            guarded.allows(&other, None).unwrap_err().0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            guarded.allows(&other, Some("wrong")).unwrap_err().0,
            StatusCode::UNAUTHORIZED
        );
        assert!(guarded.allows(&other, Some("s3cret")).is_ok());
    }
}
