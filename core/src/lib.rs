//! The vial format crate: identifiers, digests, references, media types and OCI manifest types.
//!
//! Everything here is pure data and pure functions. The crate does no I/O and knows nothing of HTTP,
//! SQL or FUSE, so every other crate can build on it and it can be tested in isolation.
//!
//! Identifiers are validated newtypes: a [`Digest`], [`RepoName`], [`Tag`] or [`Reference`] that exists
//! has already been checked against the grammar of the OCI distribution specification, so code that
//! receives one never re-validates it.

pub mod chunker;
pub mod chunking;
mod digest;
pub mod manifest;
pub mod media;
mod name;
mod reference;
pub mod safetensors;
pub mod volume;

pub use digest::{Algorithm, Digest, DigestError, DigestHasher};
pub use name::{NameError, RepoName, Tag};
pub use reference::{Reference, ReferenceError, Target};

/// `1.5 GiB`-style sizes, for people: binary units, one decimal.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `outer: inner: innermost`: an error and its sources on one line, for logs.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(super::human_bytes(0), "0 B");
        assert_eq!(super::human_bytes(1023), "1023 B");
        assert_eq!(super::human_bytes(1536), "1.5 KiB");
        assert_eq!(super::human_bytes(5 << 30), "5.0 GiB");
        // Past the largest unit the number grows instead.
        assert_eq!(super::human_bytes(u64::MAX), "16384.0 PiB");
    }
}
