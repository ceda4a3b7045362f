//! Repository names and tags, validated against the distribution-spec grammar.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest repository name we accept. The spec suggests keeping host plus name under 255 characters.
pub const MAX_NAME_LEN: usize = 255;
/// Longest tag the spec allows.
pub const MAX_TAG_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("invalid repository name {0:?}: components are lowercase letters and digits, separated by '.', '_', '__' or dashes, joined by '/'")]
    InvalidName(String),
    #[error("repository name is {0} characters long, over the limit of {MAX_NAME_LEN}")]
    NameTooLong(usize),
    #[error("invalid tag {0:?}: up to 128 of letters, digits, '_', '.', '-', not starting with '.' or '-'")]
    InvalidTag(String),
}

/// A repository (volume) name such as `weights/qwen3-8b`, with any number of `/` components.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoName(String);

impl RepoName {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        if s.len() > MAX_NAME_LEN {
            return Err(NameError::NameTooLong(s.len()));
        }
        if s.is_empty() || !s.split('/').all(is_path_component) {
            return Err(NameError::InvalidName(s.to_owned()));
        }
        Ok(RepoName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Everything before the last `/`, or the empty string for a single-component name.
    pub fn namespace(&self) -> &str {
        self.0.rsplit_once('/').map(|(ns, _)| ns).unwrap_or("")
    }
}

/// One component: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn is_path_component(c: &str) -> bool {
    let bytes = c.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator run: '.', '_', '__' or one or more '-'.
        let start = i;
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < bytes.len() && bytes[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < bytes.len() && bytes[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
        if i == start || i >= bytes.len() || !alnum(bytes[i]) {
            return false;
        }
    }
    true
}

impl fmt::Display for RepoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RepoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RepoName({})", self.0)
    }
}

impl FromStr for RepoName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RepoName::parse(s)
    }
}

/// A tag: `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(String);

impl Tag {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        let bytes = s.as_bytes();
        let first_ok = bytes
            .first()
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_');
        let rest_ok = bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !first_ok || !rest_ok || bytes.len() > MAX_TAG_LEN {
            return Err(NameError::InvalidTag(s.to_owned()));
        }
        Ok(Tag(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tag({})", self.0)
    }
}

impl FromStr for Tag {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Tag::parse(s)
    }
}

macro_rules! serde_via_parse {
    ($ty:ty) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = String::deserialize(deserializer)?;
                <$ty>::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}
serde_via_parse!(RepoName);
serde_via_parse!(Tag);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_many_components_and_separators_are_valid() {
        for ok in [
            "a",
            "weights/qwen3-8b",
            "a/b/c/d/e",
            "my_repo/with__double",
            "x.y/z--w",
            "0abc/1-2-3",
        ] {
            assert!(RepoName::parse(ok).is_ok(), "{ok} should be valid");
        }
    }

    #[test]
    fn malformed_names_are_rejected() {
        for bad in [
            "", "A", "a/", "/a", "a//b", "a..b", "a___b", "-a", "a-", "a/_b", "a b", "a/B", "a:b",
            "a/./b", "a/../b",
        ] {
            assert!(RepoName::parse(bad).is_err(), "{bad:?} should be invalid");
        }
        let long = "a".repeat(MAX_NAME_LEN + 1);
        assert_eq!(
            RepoName::parse(&long),
            Err(NameError::NameTooLong(MAX_NAME_LEN + 1))
        );
    }

    #[test]
    fn namespace_is_everything_before_the_last_component() {
        assert_eq!(
            RepoName::parse("weights/team/x").unwrap().namespace(),
            "weights/team"
        );
        assert_eq!(RepoName::parse("x").unwrap().namespace(), "");
    }

    #[test]
    fn tags_follow_the_grammar() {
        for ok in ["latest", "v1.0", "_x", "A-b_c.d", &"a".repeat(128)] {
            assert!(Tag::parse(ok).is_ok(), "{ok} should be valid");
        }
        for bad in ["", ".x", "-x", "a/b", "a:b", "a b", &"a".repeat(129)] {
            assert!(Tag::parse(bad).is_err(), "{bad:?} should be invalid");
        }
    }
}
