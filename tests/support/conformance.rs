//! Running our conformance suite from the tests.

/// Runs the whole suite against `base_url` and returns the report.
pub fn run(base_url: &str) -> vial_conformance::Report {
    let config = vial_conformance::Config {
        base_url: base_url.to_owned(),
        namespace: "conformance".to_owned(),
        cross_mount_namespace: None,
        skip: Vec::new(),
    };
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(vial_conformance::run(&config))
}

/// Asserts that every check passed: vial implements every optional feature the suite knows, so a
/// skip is a failure too.
pub fn assert_all_pass(report: &vial_conformance::Report, what: &str) {
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
        "conformance failures on {what}:\n{}",
        failures.join("\n")
    );
}
