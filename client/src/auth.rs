//! Registry credentials: read from and written to the Docker config file every registry client
//! shares (`$DOCKER_CONFIG/config.json`, default `~/.docker/config.json`), and the HTTP challenges
//! (`Basic`, `Bearer realm=…,service=…`) that decide how they are sent.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::error::ClientError;

/// A username and password (or identity token). Never printed: Debug hides the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The Docker config file's location.
pub fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json"))
}

#[derive(Default, Serialize, Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(flatten)]
    rest: BTreeMap<String, serde_json::Value>,
}

#[derive(Default, Serialize, Deserialize)]
struct AuthEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    auth: Option<String>,
    #[serde(flatten)]
    rest: BTreeMap<String, serde_json::Value>,
}

fn read_config() -> Result<Option<(PathBuf, DockerConfig)>, ClientError> {
    let Some(path) = docker_config_path() else {
        return Ok(None);
    };
    match std::fs::read(&path) {
        Ok(bytes) => {
            let config = serde_json::from_slice(&bytes).map_err(|e| {
                ClientError::Credentials(format!("{} is not valid JSON: {e}", path.display()))
            })?;
            Ok(Some((path, config)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ClientError::io(path, e)),
    }
}

/// Credentials stored for `registry` (`host[:port]`), if any.
pub fn credentials_for(registry: &str) -> Result<Option<Credentials>, ClientError> {
    let Some((_, config)) = read_config()? else {
        return Ok(None);
    };
    let keys = [
        registry.to_owned(),
        format!("https://{registry}"),
        format!("http://{registry}"),
    ];
    let Some(entry) = keys.iter().find_map(|k| config.auths.get(k)) else {
        return Ok(None);
    };
    let Some(encoded) = &entry.auth else {
        return Ok(None);
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| {
            ClientError::Credentials(format!("credentials for {registry} are not valid base64"))
        })?;
    let text = String::from_utf8(decoded).map_err(|_| {
        ClientError::Credentials(format!("credentials for {registry} are not UTF-8"))
    })?;
    let (username, password) = text.split_once(':').ok_or_else(|| {
        ClientError::Credentials(format!("credentials for {registry} are not user:password"))
    })?;
    Ok(Some(Credentials {
        username: username.to_owned(),
        password: password.to_owned(),
    }))
}

/// Stores credentials for `registry`, keeping everything else in the file. The file is written to a
/// temporary name and renamed, with mode 0600.
pub fn store_credentials(registry: &str, creds: &Credentials) -> Result<PathBuf, ClientError> {
    let (path, mut config) = match read_config()? {
        Some(found) => found,
        None => (
            docker_config_path().ok_or_else(|| {
                ClientError::Credentials("neither DOCKER_CONFIG nor HOME is set".into())
            })?,
            DockerConfig::default(),
        ),
    };
    let encoded = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", creds.username, creds.password));
    config.auths.entry(registry.to_owned()).or_default().auth = Some(encoded);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| ClientError::io(dir, e))?;
    }
    let tmp = path.with_extension("json.vial-tmp");
    let bytes = serde_json::to_vec_pretty(&config)?;
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| ClientError::io(&tmp, e))?;
        f.write_all(&bytes).map_err(|e| ClientError::io(&tmp, e))?;
        f.sync_all().map_err(|e| ClientError::io(&tmp, e))?;
    }
    std::fs::rename(&tmp, &path).map_err(|e| ClientError::io(&path, e))?;
    Ok(path)
}

/// A parsed `WWW-Authenticate` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses `Basic realm="…"` or `Bearer realm="…",service="…",scope="…"`.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let (scheme, params) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut fields = BTreeMap::new();
    let mut rest = params;
    while let Some((key, after)) = rest.split_once('=') {
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.split_once('"') {
                Some((v, n)) => (v, n),
                None => (quoted, ""),
            }
        } else {
            after.split_once(',').unwrap_or((after, ""))
        };
        fields.insert(key, value.to_owned());
        rest = next;
    }
    Some(Challenge::Bearer {
        realm: fields.remove("realm")?,
        service: fields.remove("service"),
        scope: fields.remove("scope"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse() {
        assert_eq!(parse_challenge("Basic realm=\"x\""), Some(Challenge::Basic));
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://r/token",service="reg",scope="repository:a/b:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://r/token".into(),
                service: Some("reg".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(parse_challenge("Negotiate abc"), None);
    }

    #[test]
    fn credentials_never_show_in_debug() {
        let c = Credentials {
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
