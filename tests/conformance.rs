//! Our OCI distribution conformance suite, run against `vial serve`: every check must pass.

use crate::support::Server;

#[test]
fn vial_passes_every_conformance_check() {
    let server = Server::start();
    let config = vial_conformance::Config {
        base_url: server.url(),
        namespace: "conformance".to_owned(),
        cross_mount_namespace: None,
        skip: Vec::new(),
    };
    let report = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(vial_conformance::run(&config));
    // vial implements every optional feature the suite knows, so a skip is a failure here too.
    let failures: Vec<String> = report
        .results
        .iter()
        .filter(|r| !matches!(r.outcome, vial_conformance::Outcome::Pass))
        .map(|r| format!("{}: {:?}", r.id, r.outcome))
        .collect();
    assert!(
        report.passed() > 40,
        "suspiciously few checks ran: {}",
        report.passed()
    );
    assert!(
        failures.is_empty(),
        "conformance failures:\n{}",
        failures.join("\n")
    );
}
