//! Integration tests: the real `vial` binary, driven over HTTP and by real registry clients
//! (skopeo, the ORAS Python SDK, Debian's docker-registry).
//!
//! Tests that need a peer skip when it is missing, unless VIAL_TEST_REQUIRE_ALL=1 (as in CI), where
//! a missing peer fails the run.

// Test code may panic on any unexpected failure: that is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod auth;
mod backends;
mod bad_input;
mod cache;
mod compaction;
mod conformance;
mod containerd;
mod copy;
mod crash;
mod cri;
mod disk_full;
mod docker_registry;
mod follow;
mod gc;
mod hardening;
mod hostile;
mod install;
mod kubernetes;
mod lifecycle;
mod mount;
mod oras;
mod s3;
mod serve;
mod shapes;
mod skopeo;
mod sync;
mod ui;
mod volumes;
