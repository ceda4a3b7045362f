//! `vial serve` as a process: start-up, health, metrics, clean shutdown, data kept across restarts.

use crate::support::{oci::pseudo_random, push_blob, Server};

#[test]
fn sigterm_stops_the_server_cleanly_and_data_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_on(&data, &[]);
    let client = reqwest::blocking::Client::new();
    let bytes = pseudo_random(100_000, 3);
    let digest = push_blob(&client, &server.url(), "keep/me", &bytes);
    let status = server.stop();
    assert!(
        status.success(),
        "vial serve exited with {status} on SIGTERM"
    );

    let server = Server::start_on(&data, &[]);
    let got = client
        .get(format!("{}/v2/keep/me/blobs/{digest}", server.url()))
        .send()
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().unwrap().as_ref(), bytes.as_slice());
}

#[test]
fn health_and_metrics_endpoints_report_traffic() {
    let server = Server::start();
    let client = reqwest::blocking::Client::new();
    assert_eq!(
        client
            .get(format!("{}/healthz", server.url()))
            .send()
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        client
            .get(format!("{}/readyz", server.url()))
            .send()
            .unwrap()
            .status(),
        200
    );
    push_blob(&client, &server.url(), "metrics/test", b"abc");
    let _ = client
        .get(format!("{}/v2/metrics/test/tags/list", server.url()))
        .send()
        .unwrap();
    let text = client
        .get(format!("{}/metrics", server.url()))
        .send()
        .unwrap()
        .text()
        .unwrap();
    // Whole lines: `} 1` alone would also match a count of 10 or 11.
    for line in [
        r#"vial_http_requests_total{endpoint="upload_start",method="POST",status="201"} 1"#,
        r#"vial_http_requests_total{endpoint="tags",method="GET",status="200"} 1"#,
        "vial_bytes_received_total 3",
        "vial_upload_sessions_open 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
}

#[test]
fn serve_refuses_an_address_in_use_with_a_clear_message() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(crate::support::vial_bin())
        .args(["serve", "--addr", &addr, "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("could not listen on {addr}")),
        "{stderr}"
    );
}

#[test]
fn the_suite_runs_on_the_backends_it_was_asked_for() {
    // Guards the backend matrix of scripts/test-all: a run that claims PostgreSQL + S3 must really
    // have served from them, not silently from the embedded default.
    let server = Server::start();
    let metrics = reqwest::blocking::get(format!("{}/metrics", server.url()))
        .unwrap()
        .text()
        .unwrap();
    let (postgres, s3) = crate::support::backend();
    let expected = format!(
        "vial_backend_info{{metadata=\"{}\",blobs=\"{}\",auth=\"false\",tls=\"false\"}} 1",
        if postgres { "postgres" } else { "sqlite" },
        if s3 { "s3" } else { "filesystem" }
    );
    assert!(
        metrics.lines().any(|l| l == expected),
        "{expected} not in:\n{metrics}"
    );
}
