//! Throwaway PostgreSQL clusters for tests: initdb into a temp dir, start on a free port, stop on
//! drop. Each test that needs one starts its own, so a test that stops its database to inject a
//! fault disturbs nobody else.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::{free_port, require_all};

const PGBIN: &str = "/usr/lib/postgresql/15/bin";

pub struct PgCluster {
    dir: tempfile::TempDir,
    pub port: u16,
}

impl PgCluster {
    /// Starts a new cluster, or `None` (a skip, or a failure under VIAL_TEST_REQUIRE_ALL=1) when
    /// PostgreSQL 15 is not installed.
    pub fn start() -> Option<PgCluster> {
        if !PathBuf::from(PGBIN).join("initdb").exists() {
            assert!(
                !require_all(),
                "PostgreSQL 15 is required (VIAL_TEST_REQUIRE_ALL=1) but {PGBIN} is missing"
            );
            eprintln!("SKIP: PostgreSQL not installed");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "chown of the cluster directory failed");
        let cluster = PgCluster {
            dir,
            port: free_port(),
        };
        let data = cluster.data();
        let out = Command::new("runuser")
            .args([
                "-u",
                "postgres",
                "--",
                &format!("{PGBIN}/initdb"),
                "-D",
                &data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.start_again();
        Some(cluster)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn pg_ctl(&self, args: &[&str]) -> std::process::Output {
        Command::new("runuser")
            .args([
                "-u",
                "postgres",
                "--",
                &format!("{PGBIN}/pg_ctl"),
                "-D",
                &self.data(),
            ])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Starts (or restarts after [`PgCluster::stop`]) the server, waiting until it accepts connections.
    pub fn start_again(&self) {
        let log = self.dir.path().join("server.log").display().to_string();
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {} -c unix_socket_directories={} -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let out = self.pg_ctl(&["-l", &log, "-w", "-t", "30", "-o", &opts, "start"]);
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops the server at once, as a crash or an outage would.
    pub fn stop(&self) {
        let out = self.pg_ctl(&["-m", "immediate", "-w", "stop"]);
        assert!(
            out.status.success(),
            "pg_ctl stop failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Creates a database and returns its URL.
    pub fn database(&self, name: &str) -> String {
        create_database(
            &format!("postgres://postgres@127.0.0.1:{}", self.port),
            name,
        )
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["-m", "immediate", "-w", "stop"]);
    }
}

/// Creates database `name` on the server at `server` (a superuser URL without a database) and
/// returns its URL.
pub fn create_database(server: &str, name: &str) -> String {
    let out = Command::new("psql")
        .args([
            "-d",
            &format!("{server}/postgres"),
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
        ])
        .arg(format!("CREATE DATABASE {name}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "CREATE DATABASE failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!("{server}/{name}")
}

/// Runs one SQL statement on the database at `url`, asserting it succeeds.
pub fn psql(url: &str, sql: &str) {
    psql_value(url, sql);
}

/// The single value a query on the database at `url` returns, as text.
pub fn psql_value(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args(["-d", url, "-v", "ON_ERROR_STOP=1", "-tA", "-c", sql])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{sql} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
