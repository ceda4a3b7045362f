//! The page shell every UI page shares (header, sign-in state, styles for light and dark mode and
//! phone widths), a page as a response, links to repositories, and small formatting helpers.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use vial_core::RepoName;

use super::request::Viewer;

/// Styles, inline: the UI fetches nothing but its own pages. Light and dark follow the system.
const STYLE: &str = r#"
:root { color-scheme: light dark; --fg: #1d2430; --muted: #5c6778; --bg: #ffffff; --panel: #f4f6f9;
  --line: #d9dee6; --accent: #2f5bd3; --add: #17794a; --del: #b42828; --chg: #9a6400; }
@media (prefers-color-scheme: dark) { :root { --fg: #e3e7ee; --muted: #9aa5b5; --bg: #12161c;
  --panel: #1b2129; --line: #2c3440; --accent: #7ea2ff; --add: #4cc38a; --del: #ff7b7b; --chg: #e0b050; } }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; flex-wrap: wrap; gap: .5rem 1.25rem; align-items: center; padding: .6rem 1rem;
  border-bottom: 1px solid var(--line); background: var(--panel); }
header .brand { font-weight: 700; font-size: 1.1rem; color: var(--fg); text-decoration: none; }
header nav { display: flex; gap: 1rem; flex-wrap: wrap; }
header .who { margin-left: auto; color: var(--muted); display: flex; gap: .5rem; align-items: center; }
main { padding: 1rem; max-width: 72rem; margin: 0 auto; }
a { color: var(--accent); text-decoration: none; } a:hover { text-decoration: underline; }
h1 { font-size: 1.35rem; margin: .2rem 0 1rem; word-break: break-all; }
h2 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .35rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--muted); font-weight: 600; font-size: .85rem; }
td.num, th.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .85em; }
.digest { word-break: break-all; }
.muted { color: var(--muted); }
.tag { display: inline-block; padding: 0 .45rem; margin: 0 .2rem .2rem 0; border-radius: 1rem;
  background: var(--panel); border: 1px solid var(--line); font-size: .8rem; }
.added { color: var(--add); } .removed { color: var(--del); } .changed { color: var(--chg); }
.panel { background: var(--panel); border: 1px solid var(--line); border-radius: .4rem; padding: .75rem 1rem; margin: .75rem 0; }
.stats { display: flex; flex-wrap: wrap; gap: .5rem 2rem; }
.stats div b { display: block; font-size: 1.15rem; }
form.inline { display: flex; flex-wrap: wrap; gap: .5rem; align-items: center; margin: .5rem 0; }
input, select, button { font: inherit; padding: .3rem .5rem; border: 1px solid var(--line); border-radius: .3rem;
  background: var(--bg); color: var(--fg); max-width: 100%; }
button { cursor: pointer; background: var(--panel); }
button.copy { font-size: .75rem; padding: 0 .4rem; margin-left: .3rem; }
pre { background: var(--panel); padding: .75rem; border-radius: .4rem; overflow-x: auto; font-size: .8rem; }
.pager { display: flex; gap: 1rem; margin: 1rem 0; }
.error { color: var(--del); }
@media (max-width: 40rem) { th.wide, td.wide { display: none; } main { padding: .6rem; } }
"#;

/// Copies the text of the element named by a copy button's `data-copy`; the page works without it.
const COPY_SCRIPT: &str = r#"
document.addEventListener('click', function (e) {
  var b = e.target.closest('button.copy'); if (!b) return;
  var t = document.getElementById(b.dataset.copy); if (!t || !navigator.clipboard) return;
  navigator.clipboard.writeText(t.textContent.trim()).then(function () { b.textContent = 'copied'; });
});
"#;

/// A whole page. `refresh` reloads it every that many seconds (live job progress, no script).
pub fn page(title: &str, viewer: &Viewer, refresh: Option<u32>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(s) = refresh {
                    meta http-equiv="refresh" content=(s);
                }
                title { (title) " · vial" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    a.brand href="/ui/" { "vial" }
                    nav {
                        a href="/ui/" { "Volumes" }
                        a href="/ui/jobs" { "Jobs" }
                        a href="/ui/storage" { "Storage" }
                    }
                    div.who {
                        @match &viewer.subject {
                            Some(user) => {
                                span { "signed in as " b { (user) } }
                                form method="post" action="/ui/logout" { button type="submit" { "Sign out" } }
                            }
                            None if viewer.signs_in() => { a href="/ui/login" { "Sign in" } }
                            None => {}
                        }
                    }
                }
                main { (body) }
                script { (PreEscaped(COPY_SCRIPT)) }
            }
        }
    }
}

/// A value with a button that copies it (ids must be unique on the page).
pub fn copyable(id: &str, text: &str) -> Markup {
    html! {
        span.mono.digest id=(id) { (text) }
        button.copy type="button" data-copy=(id) title="Copy" { "copy" }
    }
}

/// `sha256:0123456789ab`: enough of a digest to tell versions apart in a table.
pub fn short(digest: &str) -> String {
    match digest.split_once(':') {
        Some((algorithm, hex)) => format!("{algorithm}:{}", &hex[..hex.len().min(12)]),
        None => digest.to_owned(),
    }
}

/// `1.5 GiB`-style sizes.
pub use vial_core::human_bytes as bytes;

/// A Unix-milliseconds time as `2026-12-02 14:03 UTC`.
pub fn time(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    let s = humantime::format_rfc3339_seconds(t).to_string();
    format!(
        "{} UTC",
        s.replace('T', " ")
            .trim_end_matches('Z')
            .get(..16)
            .unwrap_or(&s)
    )
}

/// Links to pages `page - 1` and `page + 1` of a listing at `base` (which has a `?` already or not).
pub fn pager(base: &str, page: usize, more: bool) -> Markup {
    let sep = if base.contains('?') { '&' } else { '?' };
    html! {
        div.pager {
            @if page > 0 { a href=(format!("{base}{sep}page={}", page - 1)) { "← newer" } }
            @if more { a href=(format!("{base}{sep}page={}", page + 1)) { "older →" } }
        }
    }
}

/// A repository's page, or one of its subpages (`v/<digest>`, `compare`, `tags/<tag>`).
pub(super) fn repo_url(repo: &RepoName, sub: &str) -> String {
    if sub.is_empty() {
        format!("/ui/r/{repo}")
    } else {
        format!("/ui/r/{repo}/-/{sub}")
    }
}

/// A page as a response: HTML, never cached (what it shows depends on who asks).
pub(super) fn html_response(status: StatusCode, markup: Markup) -> Response {
    let mut r = (status, markup.into_string()).into_response();
    crate::http::set_header(&mut r, "content-type", "text/html; charset=utf-8");
    crate::http::set_header(&mut r, "cache-control", "no-store");
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_and_times_read_plainly() {
        let viewer = Viewer {
            subject: Some("<b>mallory</b>".into()),
            rules: None,
            host: "h".into(),
        };
        let html = page("t", &viewer, None, html! { p { "x" } }).into_string();
        assert!(html.contains("&lt;b&gt;mallory&lt;/b&gt;"));
        assert!(!html.contains("<b>mallory</b>"));
        assert_eq!(time(0), "1970-01-01 00:00 UTC");
        assert_eq!(short("sha256:0123456789abcdef"), "sha256:0123456789ab");
        assert_eq!(bytes(1536), "1.5 KiB");
    }
}
