//! The `files` benchmark's report: a table per checkpoint size and backend, then the goals.

use super::results::{Results, Row, GIB, HASHING};
use crate::report::{num, table, times, Goal};

fn fastest<'a>(rows: &'a [Row], op: &str, peers: &[&str]) -> Option<&'a Row> {
    rows.iter()
        .filter(|r| r.op == op && peers.contains(&r.client.as_str()) && r.seconds.is_some())
        .min_by(|a, b| {
            a.seconds
                .unwrap_or(f64::MAX)
                .total_cmp(&b.seconds.unwrap_or(f64::MAX))
        })
}

/// A row's wall seconds, with the range of its rounds when there were several.
fn wall(r: &Row) -> String {
    let lo = r.samples.iter().copied().reduce(f64::min);
    let hi = r.samples.iter().copied().reduce(f64::max);
    match (lo, hi) {
        (Some(lo), Some(hi)) if r.samples.len() > 1 => {
            format!("{} ({lo:.2}-{hi:.2})", num(r.seconds, 2))
        }
        _ => num(r.seconds, 2),
    }
}

fn find<'a>(rows: &'a [Row], op: &str, client: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.op == op && r.client == client)
}

pub(super) fn report(results: &mut Results) {
    // The peers; the client that hashes its files has a line of its own below.
    const PEERS: [&str; 3] = ["file-per-layer", "skopeo", "oras-py"];
    let mut goals = Vec::new();
    for run in &results.runs {
        let gib = run.bytes as f64 / GIB;
        let rows: Vec<Vec<String>> = run
            .rows
            .iter()
            .map(|r| {
                let peer = fastest(&run.rows, &r.op, &PEERS);
                let s3: Vec<String> =
                    r.s3.iter()
                        .map(|(m, n)| format!("{m} {:.1}", *n as f64 / gib))
                        .collect();
                vec![
                    r.op.clone(),
                    r.client.clone(),
                    wall(r),
                    times(
                        peer.and_then(|p| p.seconds)
                            .zip(r.seconds)
                            .map(|(p, s)| p / s),
                    ),
                    num(r.client_cpu, 2),
                    num(r.registry_cpu, 2),
                    num(r.rss_mib, 0),
                    if s3.is_empty() {
                        "-".into()
                    } else {
                        s3.join(", ")
                    },
                    r.error
                        .clone()
                        .map(|e| e.chars().take(60).collect())
                        .unwrap_or_default(),
                ]
            })
            .collect();
        let rounds = run.rows.iter().map(|r| r.samples.len()).max().unwrap_or(1);
        let medians = if rounds > 1 {
            format!(
                "; vial and file-per-layer: the median of {rounds} rounds, their range in brackets"
            )
        } else {
            String::new()
        };
        table(
            &format!("{} GiB ({} backend): wall and CPU seconds; 'vs fastest peer' above 1 means faster than the fastest file-per-layer client{medians}", run.gib, run.backend),
            &["op", "client", "wall s", "vs fastest peer", "client CPU s", "registry CPU s", "client RSS MiB", "S3 requests per GiB", "error"],
            &rows,
        );
        let label = format!("{} GiB {}", run.gib, run.backend);
        let ratio_goal = |goals: &mut Vec<Goal>,
                          what: &str,
                          op: &str,
                          mine: Option<&Row>,
                          against: Option<&Row>| {
            let r = mine
                .and_then(|m| m.seconds)
                .zip(against.and_then(|a| a.seconds))
                .map(|(m, a)| a / m);
            goals.push(Goal {
                goal: format!("{label}: {what} >= 1.0x"),
                pass: r.map(|r| r >= 1.0),
                detail: format!(
                    "{} against {} ({op})",
                    times(r),
                    against.map_or("n/a".into(), |a| a.client.clone())
                ),
            });
        };
        for op in ["push", "pull (cold)", "pull (warm)"] {
            ratio_goal(
                &mut goals,
                &format!("vial {op} vs the fastest file-per-layer client"),
                op,
                find(&run.rows, op, "vial"),
                fastest(&run.rows, op, &PEERS),
            );
        }
        // Not one of the goals: the same push by a client handed no digests.
        ratio_goal(
            &mut goals,
            "vial push vs a file-per-layer client that hashes its files",
            "push",
            find(&run.rows, "push", "vial"),
            find(&run.rows, "push", HASHING),
        );
        ratio_goal(
            &mut goals,
            "cold full read through vial mount vs that pull",
            "full read",
            find(&run.rows, "full read", "vial mount"),
            fastest(&run.rows, "pull (cold)", &PEERS),
        );
        if run.backend == "s3" {
            let puts = find(&run.rows, "push", "vial")
                .and_then(|r| r.s3.get("PUT"))
                .copied();
            goals.push(Goal {
                goal: format!("{label}: S3 PUTs per GiB of new data <= 32"),
                pass: puts.map(|p| p as f64 / gib <= 32.0),
                detail: format!("{:.1} per GiB", puts.unwrap_or(0) as f64 / gib),
            });
        }
        let rss = run
            .rows
            .iter()
            .filter(|r| r.client == "vial")
            .filter_map(|r| r.rss_mib)
            .fold(0.0f64, f64::max);
        goals.push(Goal {
            goal: format!("{label}: vial push/pull client RSS < 512 MiB"),
            pass: Some(rss < 512.0),
            detail: format!("{rss:.0} MiB"),
        });
    }
    if let Some(c) = &results.concurrent {
        goals.push(Goal {
            goal: format!(
                "registry RSS < 150 MiB under {} concurrent 1 GiB pushes",
                c.pushes
            ),
            pass: Some(c.registry_peak_rss_mib < 150.0),
            detail: format!("{:.0} MiB, {:.1} s", c.registry_peak_rss_mib, c.seconds),
        });
    }
    crate::report::print_goal_list(&goals, &[]);
    results.goals = goals;
}
