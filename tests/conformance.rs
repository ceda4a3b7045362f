//! Our OCI distribution conformance suite, run against `vial serve`: every check must pass.

use crate::support::{conformance, Server};

#[test]
fn vial_passes_every_conformance_check() {
    let server = Server::start();
    conformance::assert_all_pass(&conformance::run(&server.url()), "SQLite + filesystem");
}

/// The suite must be able to fail: against CNCF Distribution 2.8, which is known not to sort tag
/// lists or serve the referrers API, exactly those checks fail while the basics pass.
#[test]
fn the_suite_catches_docker_registrys_known_gaps() {
    let Some(peer) = crate::support::DockerRegistry::start() else {
        return;
    };
    let config = vial_conformance::Config {
        base_url: format!("http://{}", peer.addr),
        namespace: "conformance".to_owned(),
        cross_mount_namespace: None,
        skip: Vec::new(),
    };
    let report = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(vial_conformance::run(&config));
    let outcome = |id: &str| {
        report
            .results
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.outcome.clone())
            .unwrap_or_else(|| panic!("check {id} did not run"))
    };
    for id in [
        "discovery.tags.sorted",
        "discovery.referrers.list",
        "push.chunked.out-of-order-416",
        "manifest.invalid-reference-404",
        "manifest.layer-size-mismatch-400",
        "manifest.index-sparse",
    ] {
        assert!(
            matches!(outcome(id), vial_conformance::Outcome::Fail(_)),
            "{id} should fail on docker-registry"
        );
    }
    for id in [
        "base.v2",
        "pull.blob.get",
        "manifest.push-by-tag",
        "pull.range.closed",
    ] {
        assert!(
            matches!(outcome(id), vial_conformance::Outcome::Pass),
            "{id} should pass on docker-registry: {:?}",
            outcome(id)
        );
    }
}
