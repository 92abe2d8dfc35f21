//! Who may read: a request from this machine's loopback, or one carrying the token
//! (`Authorization: Bearer TOKEN`; a browser's `?token=TOKEN` is exchanged once for a cookie).
//! And to whom: the `Host` a request names must be this server's (its address, `localhost`
//! when it serves loopback, or a name it was given), so that a web page the operator opens
//! cannot reach it through a name rebound to 127.0.0.1 (DNS rebinding).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use subtle::ConstantTimeEq;

/// The cookie a browser keeps the token in, once it showed `?token=`.
const COOKIE: &str = "forte_token";

/// The token other hosts must show (none: loopback only), and the names this server answers
/// to besides its address.
#[derive(Clone, Default)]
pub struct Access {
    pub(crate) token: Option<Arc<str>>,
    /// Host names (as in the `Host` header, without port) this server answers to.
    names: Vec<String>,
    /// The address it serves, set when it binds.
    pub(crate) bound: Option<SocketAddr>,
}

impl Access {
    /// Readers on loopback, other hosts with `token` (if any); answering to `names` besides
    /// the server's own addresses.
    pub fn new(token: Option<Arc<str>>, names: Vec<String>) -> Self {
        Self {
            token,
            names,
            bound: None,
        }
    }
}

/// A refusal: its status and what it says.
type Refused = (StatusCode, String);

impl Access {
    /// Whether a request from `peer` that shows `shown` may read.
    fn allows(&self, peer: &SocketAddr, shown: Option<&str>) -> Result<(), Refused> {
        // An IPv4 client of a server bound to [::] comes as ::ffff:a.b.c.d.
        if peer.ip().to_canonical().is_loopback() {
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

    /// Whether `host` (a request's `Host` header) names this server: an address it serves,
    /// `localhost` when it serves loopback, or one of its names. A request without one (not
    /// from a browser) is let through to the token check.
    fn answers_to(&self, host: Option<&str>) -> Result<(), Refused> {
        let Some(host) = host else { return Ok(()) };
        let name = strip_port(host);
        let bound = self.bound.map(|b| b.ip().to_canonical());
        let serves_loopback = bound.is_none_or(|ip| ip.is_loopback() || ip.is_unspecified());
        let ok = match name
            .trim_matches(|c| c == '[' || c == ']')
            .parse::<IpAddr>()
        {
            Ok(ip) => bound.is_none_or(|b| {
                b.is_unspecified()
                    || b == ip.to_canonical()
                    || (b.is_loopback() && ip.is_loopback())
            }),
            Err(_) => {
                (serves_loopback && name.eq_ignore_ascii_case("localhost"))
                    || self.names.iter().any(|n| n.eq_ignore_ascii_case(name))
            }
        };
        if ok {
            Ok(())
        } else {
            Err((
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "this server does not answer to the name {name:?} (a page elsewhere reaching it through a name of its own?); \
                     to serve under that name, start forte with --http-name {name}"
                ),
            ))
        }
    }
}

/// `host` without its `:port`.
fn strip_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        // "[::1]:80", "name:80", "1.2.3.4:80"; not the colons inside "[::1]".
        Some((name, port)) if !port.contains(']') && port.chars().all(|c| c.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

/// The token a request shows: its bearer token, its cookie, or its `token` query parameter.
struct Shown {
    token: String,
    /// Whether it came as the query parameter: to be exchanged for the cookie.
    in_query: bool,
}

/// The token a request shows, if any.
fn shown(request: &Request) -> Option<Shown> {
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let cookie = || {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, _)| *k == COOKIE)
            .map(|(_, v)| crate::pages::unescape_query(v))
    };
    let query = || {
        query_token(request).map(|token| Shown {
            token,
            in_query: true,
        })
    };
    let sent = |token| Shown {
        token,
        in_query: false,
    };
    bearer.or_else(cookie).map(sent).or_else(query)
}

/// The `token` query parameter of a request.
fn query_token(request: &Request) -> Option<String> {
    request.uri().query().and_then(|q| {
        q.split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| *k == "token")
            .map(|(_, v)| crate::pages::unescape_query(v))
    })
}

/// The request's address without its `token` parameter, its path begun by one slash: a
/// browser takes `//host/…` (or `/\host/…`) in a redirect for another server's address, which
/// would make a link with a valid token an open redirect.
fn without_token(request: &Request) -> String {
    let path = format!("/{}", request.uri().path().trim_start_matches(['/', '\\']));
    let rest: Vec<&str> = request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.starts_with("token="))
        .collect();
    if rest.is_empty() {
        path
    } else {
        format!("{path}?{}", rest.join("&"))
    }
}

/// Refuses what [`Access::answers_to`] and [`Access::allows`] do not allow, with the reason as
/// `{"error": …}`. A page opened with a valid `?token=` is redirected to its address without
/// it, the token set as an HttpOnly, SameSite=Strict cookie: it is not copied into links,
/// browser history or logs from then on.
pub async fn check(
    State(access): State<Access>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    let shown = shown(&request);
    let allowed = access
        .answers_to(host)
        .and_then(|()| access.allows(&peer, shown.as_ref().map(|s| s.token.as_str())));
    match allowed {
        Ok(()) => match shown {
            Some(Shown {
                token,
                in_query: true,
            }) if request.method() == axum::http::Method::GET => {
                let cookie = format!(
                    "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
                    crate::pages::escape_query(&token)
                );
                let mut answer = Redirect::to(&without_token(&request)).into_response();
                if let Ok(value) = HeaderValue::from_str(&cookie) {
                    answer.headers_mut().insert(header::SET_COOKIE, value);
                }
                answer
            }
            _ => next.run(request).await,
        },
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
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5000".parse().unwrap();
        let other: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        let open = Access::default();
        assert!(open.allows(&local, None).is_ok());
        assert!(open.allows(&local6, None).is_ok());
        assert!(
            open.allows(&mapped, None).is_ok(),
            "IPv4-mapped loopback is loopback"
        );
        assert_eq!(
            open.allows(&other, Some("x")).unwrap_err().0,
            StatusCode::FORBIDDEN
        );
        let guarded = Access::new(Some("s3cret".into()), Vec::new());
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

    /// A name rebound to 127.0.0.1 by another site's DNS is refused; the server's own
    /// addresses, localhost on loopback, and the names it was given are answered.
    #[test]
    fn only_this_servers_own_names_are_answered() {
        let on = |bound: &str, names: &[&str]| Access {
            bound: Some(bound.parse().unwrap()),
            names: names.iter().map(|n| n.to_string()).collect(),
            ..Access::default()
        };
        let local = on("127.0.0.1:8080", &[]);
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:8080",
            "127.0.0.1",
        ] {
            assert!(local.answers_to(Some(host)).is_ok(), "{host}");
        }
        for host in [
            "attacker.example:8080",
            "10.0.0.5:8080",
            "localhost.attacker.example",
        ] {
            assert_eq!(
                local.answers_to(Some(host)).unwrap_err().0,
                StatusCode::MISDIRECTED_REQUEST,
                "{host}"
            );
        }
        let lan = on("10.0.0.5:8080", &["forte.mine.example"]);
        assert!(lan.answers_to(Some("10.0.0.5:8080")).is_ok());
        assert!(lan.answers_to(Some("forte.mine.example:8080")).is_ok());
        assert!(lan.answers_to(Some("localhost:8080")).is_err());
        assert!(lan.answers_to(Some("10.0.0.6:8080")).is_err());
        let any = on("[::]:8080", &[]);
        assert!(any.answers_to(Some("192.168.1.9:8080")).is_ok());
        assert!(any.answers_to(Some("localhost:8080")).is_ok());
        assert!(any.answers_to(Some("evil.example")).is_err());
        assert!(any.answers_to(None).is_ok(), "no Host: not a browser");
    }

    /// A page's address after `?token=` is exchanged keeps its path and other parameters, and
    /// always names this server: leading slashes (`//attacker.example/…`) are collapsed to one.
    #[test]
    fn the_token_redirect_stays_on_this_server() {
        let redirect = |uri: &str| {
            let request = Request::builder()
                .uri(uri)
                .body(axum::body::Body::empty())
                .unwrap();
            without_token(&request)
        };
        assert_eq!(redirect("/batches?token=s&site=a"), "/batches?site=a");
        assert_eq!(redirect("/?token=s"), "/");
        assert_eq!(
            redirect("//attacker.example/x?token=s&a=1"),
            "/attacker.example/x?a=1"
        );
        assert_eq!(redirect("///attacker.example?token=s"), "/attacker.example");
    }
}
