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
