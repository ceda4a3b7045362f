//! Pure parsers for the header values the checks inspect: `Link`, `Content-Range`, the upload
//! `Range`, error codes and tag ordering. No I/O, so all of it is unit-tested here.

/// The error codes the distribution specification defines.
pub const SPEC_ERROR_CODES: [&str; 14] = [
    "BLOB_UNKNOWN",
    "BLOB_UPLOAD_INVALID",
    "BLOB_UPLOAD_UNKNOWN",
    "DIGEST_INVALID",
    "MANIFEST_BLOB_UNKNOWN",
    "MANIFEST_INVALID",
    "MANIFEST_UNKNOWN",
    "NAME_INVALID",
    "NAME_UNKNOWN",
    "SIZE_INVALID",
    "UNAUTHORIZED",
    "DENIED",
    "UNSUPPORTED",
    "TOOMANYREQUESTS",
];

/// Whether `code` has the shape the specification requires: uppercase letters and underscores.
pub fn is_error_code(code: &str) -> bool {
    !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
}

/// One link of an RFC 8288 (RFC 5988) `Link` header: its target and `rel` values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub target: String,
    pub rels: Vec<String>,
}

/// Parses a `Link` header value, which may hold several comma-separated links.
/// Returns `None` when the value is not well formed.
pub fn parse_links(value: &str) -> Option<Vec<Link>> {
    let mut links = Vec::new();
    let mut rest = value.trim_start();
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        if rest.is_empty() {
            return Some(links);
        }
        let after_open = rest.strip_prefix('<')?;
        let close = after_open.find('>')?;
        let target = after_open.get(..close)?.to_owned();
        rest = after_open.get(close + 1..)?;
        let mut rels = Vec::new();
        // Parameters: `; name=value` or `; name="quoted value"`, until a comma outside quotes.
        loop {
            rest = rest.trim_start();
            let Some(after_semi) = rest.strip_prefix(';') else {
                break;
            };
            let after_semi = after_semi.trim_start();
            let name_end = after_semi
                .find(|c: char| c == '=' || c == ';' || c == ',' || c.is_whitespace())
                .unwrap_or(after_semi.len());
            let name = after_semi.get(..name_end)?.to_ascii_lowercase();
            rest = after_semi.get(name_end..)?.trim_start();
            let mut param_value = String::new();
            if let Some(after_eq) = rest.strip_prefix('=') {
                let after_eq = after_eq.trim_start();
                if let Some(quoted) = after_eq.strip_prefix('"') {
                    let end = quoted.find('"')?;
                    param_value = quoted.get(..end)?.to_owned();
                    rest = quoted.get(end + 1..)?;
                } else {
                    let end = after_eq
                        .find(|c: char| c == ';' || c == ',' || c.is_whitespace())
                        .unwrap_or(after_eq.len());
                    param_value = after_eq.get(..end)?.to_owned();
                    rest = after_eq.get(end..)?;
                }
            }
            if name == "rel" {
                rels.extend(param_value.split_whitespace().map(str::to_ascii_lowercase));
            }
        }
        links.push(Link { target, rels });
        rest = rest.trim_start();
        if !rest.is_empty() && !rest.starts_with(',') {
            return None;
        }
    }
}

/// The target of the `rel="next"` link in a `Link` header value, if there is one.
pub fn link_next(value: &str) -> Option<String> {
    parse_links(value)?
        .into_iter()
        .find(|l| l.rels.iter().any(|r| r == "next"))
        .map(|l| l.target)
}

/// A satisfied `Content-Range` value: `bytes <start>-<end>/<total or *>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    pub start: u64,
    pub end: u64,
    pub total: Option<u64>,
}

/// Parses `bytes 2-5/10` (or `bytes 2-5/*`). The unsatisfied form `bytes */10` is not a range and
/// gives `None`; see [`unsatisfied_length`].
pub fn parse_content_range(value: &str) -> Option<ContentRange> {
    let rest = value.trim().strip_prefix("bytes")?;
    let rest = rest.strip_prefix(|c: char| c.is_whitespace())?.trim_start();
    let (span, total) = rest.split_once('/')?;
    let (start, end) = span.split_once('-')?;
    let start = parse_decimal(start)?;
    let end = parse_decimal(end)?;
    let total = match total {
        "*" => None,
        t => Some(parse_decimal(t)?),
    };
    if end < start || total.is_some_and(|t| end >= t) {
        return None;
    }
    Some(ContentRange { start, end, total })
}

/// The complete length from an unsatisfied-range `Content-Range: bytes */<length>`.
pub fn unsatisfied_length(value: &str) -> Option<u64> {
    let rest = value.trim().strip_prefix("bytes")?;
    let rest = rest.strip_prefix(|c: char| c.is_whitespace())?.trim_start();
    parse_decimal(rest.strip_prefix("*/")?)
}

/// Parses an upload session's `Range` header, which the specification writes `0-<end-of-range>`
/// (the regular expression `^[0-9]+-[0-9]+$`, no unit).
pub fn parse_upload_range(value: &str) -> Option<(u64, u64)> {
    let (start, end) = value.trim().split_once('-')?;
    Some((parse_decimal(start)?, parse_decimal(end)?))
}

/// A non-empty string of ASCII digits, as a number.
pub fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Whether the list is in byte ("ASCIIbetical") order, as Go's `sort.Strings` sorts.
pub fn is_ascii_sorted(items: &[String]) -> bool {
    items.windows(2).all(|w| w[0] <= w[1])
}

/// Whether the list is in case-insensitive lexical order (ties between case variants in any order).
pub fn is_case_insensitive_sorted(items: &[String]) -> bool {
    items
        .windows(2)
        .all(|w| w[0].to_ascii_lowercase() <= w[1].to_ascii_lowercase())
}

/// The first `max` characters of a response body, for failure messages.
pub fn snippet(body: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(body);
    let trimmed = text.trim();
    if trimmed.chars().count() <= max {
        trimmed.to_owned()
    } else {
        let mut s: String = trimmed.chars().take(max).collect();
        s.push('…');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_header_next() {
        assert_eq!(
            link_next(r#"</v2/a/tags/list?n=2&last=b>; rel="next""#).as_deref(),
            Some("/v2/a/tags/list?n=2&last=b")
        );
        assert_eq!(
            link_next("<http://h/v2/_catalog?last=x&n=1>;rel=next").as_deref(),
            Some("http://h/v2/_catalog?last=x&n=1")
        );
        assert_eq!(
            link_next(r#"</first>; rel="prev", </second?a=1,2>; title="x; y"; rel="last next""#)
                .as_deref(),
            Some("/second?a=1,2")
        );
        assert_eq!(link_next(r#"</p>; rel="prev""#), None);
        assert_eq!(link_next("no brackets; rel=next"), None);
        assert_eq!(link_next(r#"</p>; rel="NEXT""#).as_deref(), Some("/p"));
    }

    #[test]
    fn link_header_malformed() {
        assert_eq!(parse_links("</a"), None);
        assert_eq!(parse_links(r#"</a>; rel="next"#), None);
        assert_eq!(parse_links("</a> junk"), None);
        assert_eq!(parse_links(""), Some(vec![]));
    }

    #[test]
    fn content_range() {
        assert_eq!(
            parse_content_range("bytes 2-5/10"),
            Some(ContentRange {
                start: 2,
                end: 5,
                total: Some(10)
            })
        );
        assert_eq!(
            parse_content_range("bytes 0-0/*"),
            Some(ContentRange {
                start: 0,
                end: 0,
                total: None
            })
        );
        assert_eq!(parse_content_range("bytes 5-2/10"), None);
        assert_eq!(parse_content_range("bytes 2-10/10"), None);
        assert_eq!(parse_content_range("bytes=2-5/10"), None);
        assert_eq!(parse_content_range("bytes */10"), None);
        assert_eq!(parse_content_range("items 2-5/10"), None);
        assert_eq!(unsatisfied_length("bytes */10"), Some(10));
        assert_eq!(unsatisfied_length("bytes 2-5/10"), None);
    }

    #[test]
    fn upload_range() {
        assert_eq!(parse_upload_range("0-99"), Some((0, 99)));
        assert_eq!(parse_upload_range(" 0-0 "), Some((0, 0)));
        assert_eq!(parse_upload_range("bytes=0-99"), None);
        assert_eq!(parse_upload_range("0-"), None);
        assert_eq!(parse_upload_range("-5"), None);
        assert_eq!(parse_upload_range("+1-5"), None);
    }

    #[test]
    fn tag_ordering() {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(is_ascii_sorted(&v(&["B", "a", "a1", "b", "c"])));
        assert!(!is_ascii_sorted(&v(&["a", "B"])));
        assert!(is_case_insensitive_sorted(&v(&["a", "a1", "B", "b", "c"])));
        assert!(is_case_insensitive_sorted(&v(&["a", "a1", "b", "B", "c"])));
        assert!(!is_case_insensitive_sorted(&v(&["B", "a"])));
    }

    #[test]
    fn error_codes() {
        for code in SPEC_ERROR_CODES {
            assert!(is_error_code(code));
        }
        assert!(!is_error_code(""));
        assert!(!is_error_code("blob_unknown"));
        assert!(!is_error_code("BLOB-UNKNOWN"));
    }

    #[test]
    fn snippets_are_bounded() {
        assert_eq!(snippet(b"  short  ", 10), "short");
        assert_eq!(snippet(b"abcdefghijkl", 4), "abcd…");
    }
}
