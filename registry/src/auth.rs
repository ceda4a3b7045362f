//! Authentication and authorization: the Docker/OCI token flow with a token endpoint built in.
//!
//! A client without a token gets `401` and `WWW-Authenticate: Bearer realm=…,service=…,scope=…`.
//! It asks the realm (`GET /token`, this server) for a token with its credentials (HTTP Basic, or an
//! OAuth2 password grant POST); the token grants the intersection of the scopes it asked for and
//! what the rules allow that user. Tokens are HS256 JWTs signed with a key every replica shares,
//! so any replica verifies a token any other issued.
//!
//! Users come from an htpasswd file (bcrypt) or the config. Rules grant actions (`pull`, `push`,
//! `delete`) on repository patterns to users, to `*` (any signed-in user) or to `anonymous`.
//! Failed sign-ins are counted per user and client address: past a limit the client is refused
//! with 429 until the window ends, so guessing passwords is slow.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

pub use crate::config::{Action, AuthSettings, Rule, UserEntry};
use crate::error::{ApiError, ErrorCode};

#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} line {line}: {problem}")]
    Htpasswd {
        path: String,
        line: usize,
        problem: &'static str,
    },
    #[error("user {0:?}: the password hash is not bcrypt ($2a$, $2b$ or $2y$); make one with `htpasswd -nB USER`")]
    NotBcrypt(String),
    #[error("the token key file {0} holds fewer than 32 bytes")]
    ShortKey(String),
}

/// The signing key; never printed.
#[derive(Clone)]
struct TokenKey(Vec<u8>);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(***)")
    }
}

/// Failed sign-ins one (user, address) pair may make per window before it is refused.
const MAX_FAILURES: u32 = 10;
/// Failed sign-ins one address may make per window, whatever the user names (password spraying).
const MAX_FAILURES_PER_ADDRESS: u32 = 50;
const FAILURE_WINDOW: Duration = Duration::from_secs(15 * 60);

/// Failures are counted per (user, address) and per address alone (`None`).
type FailureKey = (Option<String>, IpAddr);

pub struct Auth {
    settings: AuthSettings,
    key: TokenKey,
    /// User name to bcrypt hash.
    users: HashMap<String, String>,
    /// Verified against when a sign-in names an unknown user, so that answer takes as long as a
    /// wrong password for a real one: a hash at the cost most users' hashes have.
    dummy_hash: String,
    failures: Mutex<HashMap<FailureKey, (u32, Instant)>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("settings", &self.settings)
            .field("key", &self.key)
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Who a request is, once its token checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub subject: String,
    access: Vec<Access>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Access {
    #[serde(rename = "type")]
    kind: String,
    name: String,
    actions: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    aud: String,
    exp: u64,
    iat: u64,
    access: Vec<Access>,
}

/// What an endpoint needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// Any valid token (the `/v2/` check clients make first).
    SignedIn,
    /// `registry:catalog:*`.
    Catalog,
    Repository(String, Action),
}

impl Need {
    fn scope(&self) -> Option<String> {
        match self {
            Need::SignedIn => None,
            Need::Catalog => Some("registry:catalog:*".into()),
            Need::Repository(repo, action) => {
                Some(format!("repository:{repo}:{}", action.as_str()))
            }
        }
    }
}

const ANONYMOUS: &str = "anonymous";

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `*` matches any run of characters, everything else itself.
fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            let Some(tail) = name.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len())
                .filter(|&i| tail.is_char_boundary(i))
                .any(|i| pattern_matches(rest, &tail[i..]))
        }
    }
}

/// An RFC 9110 quoted string: `"` and `\\` escaped, control characters dropped, so no value can
/// end the string and add parameters of its own.
fn quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars().filter(|c| !c.is_control()) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn is_bcrypt(hash: &str) -> bool {
    ["$2a$", "$2b$", "$2y$"].iter().any(|p| hash.starts_with(p))
}

impl Auth {
    /// Loads users and the signing key.
    pub fn load(settings: AuthSettings) -> Result<Auth, AuthConfigError> {
        let mut users = HashMap::new();
        if let Some(path) = &settings.htpasswd {
            users.extend(read_htpasswd(path)?);
        }
        for u in &settings.users {
            if !is_bcrypt(&u.password_hash) {
                return Err(AuthConfigError::NotBcrypt(u.name.clone()));
            }
            users.insert(u.name.clone(), u.password_hash.clone());
        }
        let key = match &settings.token_key_file {
            Some(path) => {
                let bytes = std::fs::read(path).map_err(|source| AuthConfigError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                if bytes.len() < 32 {
                    return Err(AuthConfigError::ShortKey(path.display().to_string()));
                }
                bytes
            }
            None => {
                tracing::warn!("no token key file: tokens are valid only on this process; replicas need a shared token-key-file");
                let mut key = Vec::with_capacity(32);
                while key.len() < 32 {
                    key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
                }
                key
            }
        };
        let dummy_hash = dummy_hash_like(users.values());
        tracing::info!(
            users = users.len(),
            rules = settings.rules.len(),
            "authentication on"
        );
        Ok(Auth {
            settings,
            key: TokenKey(key),
            users,
            dummy_hash,
            failures: Mutex::new(HashMap::new()),
        })
    }

    pub fn service(&self) -> &str {
        &self.settings.service
    }

    /// Whether `subject` may do `action` in `repo` under the rules. Signing in never takes rights
    /// away: what anonymous clients may do, every signed-in user may do too, so a client that sends
    /// credentials (after `docker login`) can pull whatever it could pull without them.
    fn allowed(&self, subject: &str, repo: &str, action: Action) -> bool {
        if self.settings.rules.is_empty() {
            return subject != ANONYMOUS;
        }
        self.settings.rules.iter().any(|rule| {
            rule.actions.contains(&action)
                && pattern_matches(&rule.repositories, repo)
                && rule
                    .users
                    .iter()
                    .any(|u| u == subject || u == ANONYMOUS || (u == "*" && subject != ANONYMOUS))
        })
    }

    /// Checks a request's credentials against what its endpoint needs. Requests without a token
    /// pass only where anonymous access is allowed.
    pub fn authorize(
        &self,
        authorization: Option<&str>,
        need: &Need,
        realm: &str,
    ) -> Result<Identity, ApiError> {
        let token = authorization.and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        });
        let identity = match token {
            None => {
                let anonymous_ok = match need {
                    Need::Repository(repo, action) => self.allowed(ANONYMOUS, repo, *action),
                    _ => false,
                };
                if anonymous_ok {
                    return Ok(Identity {
                        subject: ANONYMOUS.into(),
                        access: Vec::new(),
                    });
                }
                return Err(self.challenge(need, realm, None, "authentication required"));
            }
            Some(token) => self
                .verify(token.trim())
                .map_err(|why| self.challenge(need, realm, Some("invalid_token"), why))?,
        };
        let granted = match need {
            Need::SignedIn => true,
            Need::Catalog => identity
                .access
                .iter()
                .any(|a| a.kind == "registry" && a.name == "catalog"),
            Need::Repository(repo, action) => identity.access.iter().any(|a| {
                a.kind == "repository"
                    && a.name == *repo
                    && a.actions.iter().any(|x| x == action.as_str() || x == "*")
            }),
        };
        if granted {
            Ok(identity)
        } else {
            let mut e = ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                ErrorCode::Denied,
                match need {
                    Need::Repository(repo, action) => {
                        format!("{} may not {} {repo}", identity.subject, action.as_str())
                    }
                    _ => format!("{} may not list the catalog", identity.subject),
                },
            );
            e.headers.push((
                "www-authenticate",
                self.challenge_header(need, realm, Some("insufficient_scope")),
            ));
            Err(e)
        }
    }

    /// Whether the rules let `subject` (anonymous for `None`) do `action` on `repo`, whatever
    /// tokens it holds: what the web UI checks for each repository it shows.
    pub fn allows(&self, subject: Option<&str>, repo: &str, action: Action) -> bool {
        self.allowed(subject.unwrap_or(ANONYMOUS), repo, action)
    }

    /// Who a token this registry issued names, if it verifies and has not expired (the UI's
    /// session cookie holds one).
    pub fn session_subject(&self, token: &str) -> Option<String> {
        self.verify(token).ok().map(|i| i.subject)
    }

    /// Whether `subject` may pull from every repository (by the rules, since a token names
    /// repositories one by one): the condition for listing the catalog and for linking blobs
    /// across repositories on its behalf.
    pub fn may_pull_everything(&self, subject: &str) -> bool {
        self.allowed(subject, "*", Action::Pull)
    }

    /// Whether the rules let `subject` delete from every repository: what administration (a
    /// garbage collection pass) needs.
    pub fn may_delete_everything(&self, subject: &str) -> bool {
        self.allowed(subject, "*", Action::Delete)
    }

    fn challenge_header(&self, need: &Need, realm: &str, error: Option<&str>) -> String {
        let realm = self.settings.realm.as_deref().unwrap_or(realm);
        let mut h = format!(
            "Bearer realm={},service={}",
            quoted(realm),
            quoted(&self.settings.service)
        );
        if let Some(scope) = need.scope() {
            h.push_str(&format!(",scope={}", quoted(&scope)));
        }
        if let Some(e) = error {
            h.push_str(&format!(",error={}", quoted(e)));
        }
        h
    }

    fn challenge(&self, need: &Need, realm: &str, error: Option<&str>, message: &str) -> ApiError {
        let mut e = ApiError::new(
            axum::http::StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            message,
        );
        e.headers.push((
            "www-authenticate",
            self.challenge_header(need, realm, error),
        ));
        e
    }

    fn sign(&self, message: &str) -> Vec<u8> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(message.as_bytes());
        mac.finalize().into_bytes().to_vec()
    }

    fn verify(&self, token: &str) -> Result<Identity, &'static str> {
        let (signed, signature) = token.rsplit_once('.').ok_or("malformed token")?;
        let signature = B64.decode(signature).map_err(|_| "malformed token")?;
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key.0).map_err(|_| "bad key")?;
        mac.update(signed.as_bytes());
        mac.verify_slice(&signature)
            .map_err(|_| "token signature is not valid")?;
        let (_, payload) = signed.split_once('.').ok_or("malformed token")?;
        let claims: Claims = B64
            .decode(payload)
            .ok()
            .and_then(|p| serde_json::from_slice(&p).ok())
            .ok_or("malformed token")?;
        if claims.aud != self.settings.service {
            return Err("token is for another service");
        }
        if claims.exp <= now_secs() {
            return Err("token has expired");
        }
        Ok(Identity {
            subject: claims.sub,
            access: claims.access,
        })
    }

    /// Issues a token for `subject` with the requested scopes cut down to what it may do.
    fn issue(&self, subject: &str, scopes: &[String]) -> (String, u64) {
        let mut access: Vec<Access> = Vec::new();
        for scope in scopes {
            // repository:NAME:ACTIONS, where NAME may itself contain ':' only in theory; split from
            // both ends.
            let Some((kind, rest)) = scope.split_once(':') else {
                continue;
            };
            let Some((name, actions)) = rest.rsplit_once(':') else {
                continue;
            };
            match kind {
                "repository" => {
                    let granted: Vec<String> = actions
                        .split(',')
                        .filter_map(|a| if a == "*" { None } else { Action::parse(a) })
                        .chain(
                            actions
                                .split(',')
                                .any(|a| a == "*")
                                .then_some([Action::Pull, Action::Push, Action::Delete])
                                .into_iter()
                                .flatten(),
                        )
                        .filter(|a| self.allowed(subject, name, *a))
                        .map(|a| a.as_str().to_owned())
                        .collect();
                    if !granted.is_empty() {
                        access.push(Access {
                            kind: kind.into(),
                            name: name.into(),
                            actions: granted,
                        });
                    }
                }
                "registry" if name == "catalog" && self.may_pull_everything(subject) => {
                    access.push(Access {
                        kind: kind.into(),
                        name: name.into(),
                        actions: vec!["*".into()],
                    });
                }
                _ => {}
            }
        }
        let iat = now_secs();
        let ttl = self.settings.token_ttl.as_secs().max(1);
        let claims = Claims {
            iss: "vial".into(),
            sub: subject.into(),
            aud: self.settings.service.clone(),
            exp: iat + ttl,
            iat,
            access,
        };
        let header = B64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let payload = B64.encode(serde_json::to_vec(&claims).unwrap_or_default());
        let signed = format!("{header}.{payload}");
        let signature = B64.encode(self.sign(&signed));
        (format!("{signed}.{signature}"), ttl)
    }

    /// Refuses an address (and user) that failed too often in the current window.
    fn throttled(&self, user: Option<&str>, ip: IpAddr) -> Option<Duration> {
        let Ok(mut failures) = self.failures.lock() else {
            return None;
        };
        let now = Instant::now();
        failures.retain(|_, (_, since)| now.duration_since(*since) < FAILURE_WINDOW);
        let over = |key: &FailureKey, limit: u32| {
            failures
                .get(key)
                .filter(|(n, _)| *n >= limit)
                .map(|(_, since)| FAILURE_WINDOW.saturating_sub(now.duration_since(*since)))
        };
        over(&(user.map(str::to_owned), ip), MAX_FAILURES)
            .or_else(|| over(&(None, ip), MAX_FAILURES_PER_ADDRESS))
    }

    fn record_failure(&self, user: &str, ip: IpAddr) {
        if let Ok(mut failures) = self.failures.lock() {
            let now = Instant::now();
            for key in [(Some(user.to_owned()), ip), (None, ip)] {
                let entry = failures.entry(key).or_insert((0, now));
                entry.0 += 1;
            }
        }
    }

    fn clear_failures(&self, user: &str, ip: IpAddr) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.remove(&(Some(user.to_owned()), ip));
        }
    }

    /// The token endpoint: credentials (or none, for an anonymous token) and the requested scopes
    /// in; a signed token out.
    pub async fn token(
        &self,
        credentials: Option<(String, String)>,
        scopes: Vec<String>,
        ip: IpAddr,
    ) -> Result<serde_json::Value, ApiError> {
        let subject = match credentials {
            None => ANONYMOUS.to_owned(),
            Some((user, password)) => {
                if let Some(wait) = self.throttled(Some(&user), ip) {
                    tracing::warn!(%user, %ip, "sign-in refused: too many failures");
                    return Err(ApiError::new(
                        axum::http::StatusCode::TOO_MANY_REQUESTS,
                        ErrorCode::TooManyRequests,
                        "too many failed sign-ins; try again later",
                    )
                    .with_header("retry-after", wait.as_secs().max(1).to_string()));
                }
                let hash = self.users.get(&user).cloned();
                let dummy = self.dummy_hash.clone();
                let ok = tokio::task::spawn_blocking(move || match hash {
                    Some(hash) => bcrypt::verify(password, &hash).unwrap_or(false),
                    None => {
                        // Spend the same time on unknown users, so timing does not tell which exist.
                        let _ = bcrypt::verify(password, &dummy);
                        false
                    }
                })
                .await
                .unwrap_or(false);
                if !ok {
                    self.record_failure(&user, ip);
                    tracing::warn!(%user, %ip, "sign-in failed");
                    return Err(ApiError::new(
                        axum::http::StatusCode::UNAUTHORIZED,
                        ErrorCode::Unauthorized,
                        "wrong user name or password",
                    ));
                }
                self.clear_failures(&user, ip);
                user
            }
        };
        let (token, ttl) = self.issue(&subject, &scopes);
        tracing::debug!(%subject, ?scopes, "token issued");
        let issued_at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        Ok(serde_json::json!({
            "token": token,
            "access_token": token,
            "expires_in": ttl,
            "issued_at": issued_at,
        }))
    }
}

/// A bcrypt hash of nothing in particular, for a registry without users.
const DUMMY_HASH: &str = "$2b$10$7EqJtq98hPqEX7fNZaFWoOhi5BWX4Z3ZBFVYnL3uNjNlUHn3yEBvi";

/// The cost of a bcrypt hash (`$2b$05$…` costs 5).
fn bcrypt_cost(hash: &str) -> Option<u32> {
    hash.get(4..6)?.parse().ok()
}

/// A hash of a random password at the cost most of `hashes` have (the highest among equals), made
/// once at start-up: unknown users are checked against it, so they cost what real ones do.
fn dummy_hash_like<'a>(hashes: impl Iterator<Item = &'a String>) -> String {
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for cost in hashes.filter_map(|h| bcrypt_cost(h)) {
        *counts.entry(cost).or_default() += 1;
    }
    let Some((cost, _)) = counts.into_iter().max_by_key(|&(cost, n)| (n, cost)) else {
        return DUMMY_HASH.to_owned();
    };
    let password = uuid::Uuid::new_v4().to_string();
    bcrypt::hash(password, cost).unwrap_or_else(|_| DUMMY_HASH.to_owned())
}

fn read_htpasswd(path: &Path) -> Result<HashMap<String, String>, AuthConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| AuthConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let mut users = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |problem| AuthConfigError::Htpasswd {
            path: path.display().to_string(),
            line: i + 1,
            problem,
        };
        let (user, hash) = line
            .split_once(':')
            .ok_or_else(|| bad("expected USER:HASH"))?;
        if !is_bcrypt(hash) {
            return Err(bad("only bcrypt hashes are accepted (htpasswd -B)"));
        }
        users.insert(user.to_owned(), hash.to_owned());
    }
    Ok(users)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(rules: Vec<Rule>) -> Auth {
        Auth::load(AuthSettings {
            users: vec![UserEntry {
                name: "alice".into(),
                password_hash: bcrypt::hash("wonderland", 4).unwrap(),
            }],
            rules,
            ..AuthSettings::default()
        })
        .unwrap()
    }

    #[test]
    fn patterns() {
        assert!(pattern_matches("weights/*", "weights/a/b"));
        assert!(pattern_matches("*", "x"));
        assert!(pattern_matches("team-*/models", "team-a/models"));
        assert!(!pattern_matches("weights/*", "weightsx/a"));
        assert!(!pattern_matches("weights", "weights/a"));
    }

    #[test]
    fn tokens_grant_only_what_the_rules_allow_and_cannot_be_altered() {
        let a = auth(vec![
            Rule {
                repositories: "weights/*".into(),
                users: vec!["alice".into()],
                actions: vec![Action::Pull],
            },
            Rule {
                repositories: "public/*".into(),
                users: vec!["anonymous".into()],
                actions: vec![Action::Pull],
            },
        ]);
        let (token, _) = a.issue("alice", &["repository:weights/x:pull,push".into()]);
        let pull = Need::Repository("weights/x".into(), Action::Pull);
        let push = Need::Repository("weights/x".into(), Action::Push);
        let bearer = format!("Bearer {token}");
        assert!(a.authorize(Some(&bearer), &pull, "r").is_ok());
        assert_eq!(
            a.authorize(Some(&bearer), &push, "r").unwrap_err().status,
            403
        );
        // Changing one character of the payload breaks the signature.
        let mut forged = token.clone().into_bytes();
        let dot = token.find('.').unwrap() + 5;
        forged[dot] = if forged[dot] == b'A' { b'B' } else { b'A' };
        let forged = format!("Bearer {}", String::from_utf8(forged).unwrap());
        assert_eq!(
            a.authorize(Some(&forged), &pull, "r").unwrap_err().status,
            401
        );
        // Anonymous: public pull only, no token needed.
        let public = Need::Repository("public/y".into(), Action::Pull);
        assert!(a.authorize(None, &public, "r").is_ok());
        assert_eq!(a.authorize(None, &pull, "r").unwrap_err().status, 401);
        // A token from another key (another registry) is refused.
        let other = auth(Vec::new());
        let (theirs, _) = other.issue("alice", &["repository:weights/x:pull".into()]);
        assert!(a
            .authorize(Some(&format!("Bearer {theirs}")), &pull, "r")
            .is_err());
    }

    #[test]
    fn unknown_users_cost_what_real_ones_do() {
        // htpasswd's default cost is 5; the fixed dummy hash costs 10, 32 times as much.
        let users: Vec<String> = (0..3)
            .map(|i| bcrypt::hash(format!("pw{i}"), 5).unwrap())
            .chain([bcrypt::hash("other", 6).unwrap()])
            .collect();
        let dummy = dummy_hash_like(users.iter());
        assert_eq!(bcrypt_cost(&dummy), Some(5), "{dummy}");
        assert!(!bcrypt::verify("pw0", &dummy).unwrap());
        assert_eq!(bcrypt_cost(&dummy_hash_like(std::iter::empty())), Some(10));
        let a = auth(Vec::new());
        assert_eq!(bcrypt_cost(&a.dummy_hash), Some(4), "the test user's cost");
    }

    #[test]
    fn challenge_values_cannot_break_out_of_their_quotes() {
        assert_eq!(quoted(r#"evil", error="x"#), r#""evil\", error=\"x""#);
        assert_eq!(quoted("a\r\nb"), "\"ab\"");
    }

    #[test]
    fn secrets_never_print() {
        let a = auth(Vec::new());
        let debug = format!("{a:?}");
        assert!(!debug.contains("$2"), "{debug}");
        assert!(debug.contains("TokenKey(***)"));
    }
}
