//! Content digests (`algorithm:hex`) and the hashers that produce them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Digest as _;

/// A digest algorithm the registry accepts.
///
/// sha256 is what every OCI client sees; sha512 is in the image-spec; blake3 is registered by the
/// image-spec as well and is much faster on large blobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    Sha256,
    Sha512,
    Blake3,
}

impl Algorithm {
    pub const ALL: [Algorithm; 3] = [Algorithm::Sha256, Algorithm::Sha512, Algorithm::Blake3];

    /// The algorithm's name as it appears before the colon of a digest.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha512 => "sha512",
            Algorithm::Blake3 => "blake3",
        }
    }

    /// Length of the hex-encoded value.
    pub fn hex_len(self) -> usize {
        match self {
            Algorithm::Sha256 | Algorithm::Blake3 => 64,
            Algorithm::Sha512 => 128,
        }
    }

    /// A fresh hasher for this algorithm.
    pub fn hasher(self) -> DigestHasher {
        DigestHasher::new(self)
    }

    /// The digest of a byte slice held in memory.
    pub fn digest_bytes(self, bytes: &[u8]) -> Digest {
        let mut hasher = self.hasher();
        hasher.update(bytes);
        hasher.finish()
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sha256" => Ok(Algorithm::Sha256),
            "sha512" => Ok(Algorithm::Sha512),
            "blake3" => Ok(Algorithm::Blake3),
            other if is_algorithm_grammar(other) => {
                Err(DigestError::UnsupportedAlgorithm(other.to_owned()))
            }
            other => Err(DigestError::Malformed(other.to_owned())),
        }
    }
}

/// Why a string is not a digest we accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("malformed digest {0:?}")]
    Malformed(String),
    #[error("unsupported digest algorithm {0:?}")]
    UnsupportedAlgorithm(String),
    #[error("digest {digest:?} has an encoded part of the wrong length or case for {algorithm}")]
    BadEncoding {
        digest: String,
        algorithm: Algorithm,
    },
}

/// A validated content digest such as `sha256:e3b0…`.
///
/// The encoded part is always lowercase hex of the algorithm's exact length, so two equal digests are
/// equal strings and a digest can be used directly as a storage key.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    algorithm: Algorithm,
    text: String,
}

impl Digest {
    /// Parses and validates `algorithm:encoded`.
    pub fn parse(s: &str) -> Result<Self, DigestError> {
        let algorithm = Self::check(s)?;
        Ok(Digest {
            algorithm,
            text: s.to_owned(),
        })
    }

    /// [`Digest::parse`] of a string it keeps: what every digest read from JSON takes, so the
    /// text is not copied again.
    pub fn parse_string(s: String) -> Result<Self, DigestError> {
        let algorithm = Self::check(&s)?;
        Ok(Digest { algorithm, text: s })
    }

    /// The algorithm of `s` if it is a digest of one vial knows, its encoding right for it.
    fn check(s: &str) -> Result<Algorithm, DigestError> {
        // Nearly every digest read is a SHA-256 one: a tree's chunk table holds up to millions.
        if let Some(hex) = s.strip_prefix("sha256:") {
            if hex.len() == Algorithm::Sha256.hex_len()
                && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            {
                return Ok(Algorithm::Sha256);
            }
        }
        let (alg, encoded) = s
            .split_once(':')
            .ok_or_else(|| DigestError::Malformed(s.to_owned()))?;
        if !is_encoded_grammar(encoded) {
            return Err(DigestError::Malformed(s.to_owned()));
        }
        let algorithm: Algorithm = alg.parse().map_err(|e| match e {
            DigestError::Malformed(_) => DigestError::Malformed(s.to_owned()),
            other => other,
        })?;
        let hex_ok = encoded.len() == algorithm.hex_len()
            && encoded
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex_ok {
            return Err(DigestError::BadEncoding {
                digest: s.to_owned(),
                algorithm,
            });
        }
        Ok(algorithm)
    }

    /// Builds a digest from raw hash output.
    pub fn from_raw(algorithm: Algorithm, raw: &[u8]) -> Self {
        Digest {
            algorithm,
            text: format!("{}:{}", algorithm, hex::encode(raw)),
        }
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The hex part after the colon.
    pub fn hex(&self) -> &str {
        &self.text[self.algorithm.as_str().len() + 1..]
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.text)
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Digest::parse(s)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Digest::parse_string(s).map_err(serde::de::Error::custom)
    }
}

/// `[a-z0-9]+([+._-][a-z0-9]+)*`, the image-spec's algorithm grammar.
fn is_algorithm_grammar(s: &str) -> bool {
    !s.is_empty()
        && s.split(['+', '.', '_', '-']).all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// `[a-zA-Z0-9=_-]+`, the image-spec's encoded grammar.
fn is_encoded_grammar(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'=' || b == b'_' || b == b'-')
}

/// An incremental hasher for any supported algorithm.
#[derive(Clone)]
pub enum DigestHasher {
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
    Blake3(Box<blake3::Hasher>),
}

impl fmt::Debug for DigestHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DigestHasher({})", self.algorithm())
    }
}

impl DigestHasher {
    pub fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::Sha256 => DigestHasher::Sha256(sha2::Sha256::new()),
            Algorithm::Sha512 => DigestHasher::Sha512(sha2::Sha512::new()),
            Algorithm::Blake3 => DigestHasher::Blake3(Box::new(blake3::Hasher::new())),
        }
    }

    pub fn algorithm(&self) -> Algorithm {
        match self {
            DigestHasher::Sha256(_) => Algorithm::Sha256,
            DigestHasher::Sha512(_) => Algorithm::Sha512,
            DigestHasher::Blake3(_) => Algorithm::Blake3,
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            DigestHasher::Sha256(h) => h.update(bytes),
            DigestHasher::Sha512(h) => h.update(bytes),
            DigestHasher::Blake3(h) => {
                h.update(bytes);
            }
        }
    }

    pub fn finish(self) -> Digest {
        let algorithm = self.algorithm();
        match self {
            DigestHasher::Sha256(h) => Digest::from_raw(algorithm, &h.finalize()),
            DigestHasher::Sha512(h) => Digest::from_raw(algorithm, &h.finalize()),
            DigestHasher::Blake3(h) => Digest::from_raw(algorithm, h.finalize().as_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY_SHA256: &str =
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn known_digests_of_empty_input() {
        assert_eq!(Algorithm::Sha256.digest_bytes(b"").as_str(), EMPTY_SHA256);
        assert_eq!(
            Algorithm::Blake3.digest_bytes(b"").as_str(),
            "blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert!(Algorithm::Sha512
            .digest_bytes(b"")
            .as_str()
            .starts_with("sha512:cf83e1357eefb8bd"));
    }

    #[test]
    fn parse_accepts_valid_and_round_trips() {
        let d = Digest::parse(EMPTY_SHA256).unwrap();
        assert_eq!(d.algorithm(), Algorithm::Sha256);
        assert_eq!(d.to_string(), EMPTY_SHA256);
        assert_eq!(d.hex().len(), 64);
    }

    #[test]
    fn parse_rejects_malformed_input() {
        for bad in [
            "",
            "sha256",
            "sha256:",
            ":abc",
            "SHA256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:e3b0",
            "sha256:zzb0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855/",
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad:?} should be rejected");
            // Read from JSON (every digest in a manifest or tree), the same checks.
            let json = serde_json::to_string(bad).unwrap();
            assert!(
                serde_json::from_str::<Digest>(&json).is_err(),
                "{bad:?} should be rejected in JSON"
            );
        }
    }

    #[test]
    fn unknown_but_well_formed_algorithm_is_unsupported_not_malformed() {
        assert!(matches!(
            Digest::parse("md5:d41d8cd98f00b204e9800998ecf8427e"),
            Err(DigestError::UnsupportedAlgorithm(_))
        ));
    }

    #[test]
    fn incremental_hashing_equals_one_shot() {
        for alg in Algorithm::ALL {
            let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
            let mut h = alg.hasher();
            for chunk in data.chunks(333) {
                h.update(chunk);
            }
            assert_eq!(h.finish(), alg.digest_bytes(&data));
        }
    }
}
