//! Signing in to the UI: a form whose credentials are checked as the token endpoint checks them
//! (same users, same throttling), answered with a session cookie holding the token it issued
//! (HttpOnly, SameSite=Strict, Secure under TLS, as long-lived as the token).

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::html;

use super::layout::{self, html_response};
use super::request::Viewer;
use std::sync::Arc;

use crate::front::ClientAddr;
use crate::state::AppState;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "vial_session";

/// Who the request's session cookie says is looking (anonymous without one, or with one that
/// no longer verifies).
pub(super) fn viewer(state: &AppState, headers: &HeaderMap) -> Viewer {
    let host = host(state, headers);
    let Some(auth) = &state.entrance.auth else {
        return Viewer {
            subject: None,
            rules: None,
            host,
        };
    };
    let token = headers
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned());
    Viewer {
        subject: token.and_then(|t| auth.session_subject(&t)),
        rules: Some(Arc::clone(auth)),
        host,
    }
}

/// How references name this registry: the public URL's host when one is set, else the `Host`
/// the browser used, if it is a plain `host[:port]`.
fn host(state: &AppState, headers: &HeaderMap) -> String {
    if let Some(url) = &state.config.public_url {
        let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
        return rest.trim_end_matches('/').to_owned();
    }
    headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .filter(|h| crate::http::is_plain_authority(h))
        .unwrap_or("localhost:5000")
        .to_owned()
}

/// `GET /ui/login`, or the form again with what went wrong.
pub(super) fn form(state: &AppState, error: Option<(StatusCode, &str)>) -> Response {
    let viewer = Viewer {
        subject: None,
        rules: state.entrance.auth.clone(),
        host: String::new(),
    };
    let status = error.map_or(StatusCode::OK, |(s, _)| s);
    let body = html! {
        h1 { "Sign in" }
        @if state.entrance.auth.is_none() {
            p { "This registry does not check credentials: everything is visible without signing in." }
        } @else {
            @if let Some((_, message)) = error { p.error { (message) } }
            form.panel method="post" action="/ui/login" {
                p { label { "User " input name="username" autocomplete="username" required; } }
                p { label { "Password " input name="password" type="password" autocomplete="current-password" required; } }
                button type="submit" { "Sign in" }
            }
            p.muted { "The same users and passwords as " code { "vial login" } "." }
        }
    };
    html_response(status, layout::page("Sign in", &viewer, None, body))
}

/// `POST /ui/login` with `username` and `password`.
pub(super) async fn sign_in(state: &AppState, client: ClientAddr, body: &[u8]) -> Response {
    let Some(auth) = &state.entrance.auth else {
        return form(state, None);
    };
    let fields: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
    let field = |k: &str| {
        fields
            .iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.clone())
    };
    let (Some(user), Some(password)) = (field("username"), field("password")) else {
        return form(
            state,
            Some((StatusCode::BAD_REQUEST, "Give a user name and a password.")),
        );
    };
    match auth
        .token(Some((user.clone(), password)), Vec::new(), client.0.ip())
        .await
    {
        Ok(answer) => {
            let token = answer["token"].as_str().unwrap_or_default();
            let ttl = answer["expires_in"].as_u64().unwrap_or(300);
            tracing::info!(%user, "signed in to the UI");
            let secure = if state.config.tls.is_some() {
                "; Secure"
            } else {
                ""
            };
            let mut r = (StatusCode::SEE_OTHER, "").into_response();
            crate::http::set_header(&mut r, "location", "/ui/");
            crate::http::set_header(
                &mut r,
                "set-cookie",
                &format!(
                    "{COOKIE}={token}; Path=/ui; Max-Age={ttl}; HttpOnly; SameSite=Strict{secure}"
                ),
            );
            r
        }
        Err(e) => {
            let message = if e.status == StatusCode::TOO_MANY_REQUESTS {
                "Too many failed sign-ins: try again later."
            } else {
                "Wrong user name or password."
            };
            form(state, Some((e.status, message)))
        }
    }
}

/// `POST /ui/logout`: the cookie goes.
pub(super) fn sign_out(state: &AppState) -> Response {
    let secure = if state.config.tls.is_some() {
        "; Secure"
    } else {
        ""
    };
    let mut r = (StatusCode::SEE_OTHER, "").into_response();
    crate::http::set_header(&mut r, "location", "/ui/");
    crate::http::set_header(
        &mut r,
        "set-cookie",
        &format!("{COOKIE}=; Path=/ui; Max-Age=0; HttpOnly; SameSite=Strict{secure}"),
    );
    r
}
