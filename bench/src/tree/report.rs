//! The `tree` benchmark's report: a table per volume and backend, then the goals of #48.

use super::measure::NOFILE;
use super::results::{
    Results, Row, VolumeRun, LS, LS_OP, MOUNT, MOUNT_OP, PULL, PULL_READ, PUSH, READ, TARBALL,
};
use crate::report::{num, print_goal_list, table, times, Goal};

/// #48's bounds on a mount of the 100,000-file volume (every volume is held to them).
const MOUNT_SECONDS: f64 = 1.0;
const LS_SECONDS: f64 = 2.0;

pub(super) fn header(r: &Results, quick: bool) {
    let m = &r.machine;
    let smoke = if quick {
        " --quick (smoke run: not for publishing)"
    } else {
        ""
    };
    println!("vial-bench tree{smoke}");
    println!("date:     {}", m.date);
    println!("machine:  nproc {}, {}, {}", m.nproc, m.cpu_model, m.kernel);
    println!("vial:     {}", r.vial_version);
    println!(
        "every client runs with the open-file limit at {} (soft and hard)",
        r.nofile
    );
}

fn find<'a>(rows: &'a [Row], op: &str, client: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.op == op && r.client == client)
}

/// The row of `op` every other row of that operation is compared to.
fn vial_row<'a>(rows: &'a [Row], op: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.op == op && r.vial)
}

/// How many times faster vial's row of `r`'s operation is than `r`: above 1, vial is faster.
fn vial_over(rows: &[Row], r: &Row) -> Option<f64> {
    let vial = vial_row(rows, r.op)?.seconds?;
    Some(r.seconds? / vial).filter(|x| x.is_finite())
}

fn cells(rows: &[Row], r: &Row) -> Vec<String> {
    vec![
        r.op.into(),
        r.client.into(),
        num(r.seconds, 2),
        if r.vial {
            "-".into()
        } else {
            times(vial_over(rows, r))
        },
        num(r.cpu, 2),
        num(r.rss_mib, 0),
        r.fds.map_or_else(|| "n/a".into(), |f| f.to_string()),
    ]
}

fn print_run(run: &VolumeRun) {
    let rows: Vec<Vec<String>> = run.rows.iter().map(|r| cells(&run.rows, r)).collect();
    table(
        &format!(
            "{} ({:.1} MB), {} backend: wall seconds, cold; vial/peer above 1 means vial is faster",
            run.volume,
            run.bytes as f64 / 1e6,
            run.backend
        ),
        &[
            "op",
            "client",
            "wall s",
            "vial/peer",
            "client CPU s",
            "client peak RSS MiB",
            "most open fds",
        ],
        &rows,
    );
    println!(
        "  the {MOUNT} rows' CPU, RSS and descriptors are the mount process's (during the read, \
         and during {LS}); registry peak RSS (VmHWM): {} MiB",
        num(run.registry_rss_mib, 0)
    );
    for r in &run.rows {
        if r.emfile {
            println!(
                "  {}, {}: its log says it ran out of descriptors",
                r.op, r.client
            );
        }
        if let Some(note) = &r.note {
            println!("  {}, {}: {note}", r.op, r.client);
        }
    }
}

/// `vial`'s row of `op` at least as fast as `peer`'s.
fn faster(run: &VolumeRun, label: &str, op: &str, peer: &str, what: &str) -> Goal {
    let ratio = find(&run.rows, op, peer).and_then(|p| vial_over(&run.rows, p));
    let vial = vial_row(&run.rows, op).map_or("vial", |r| r.client);
    Goal {
        goal: format!("{label}: {what} >= 1.0x"),
        pass: ratio.map(|r| r >= 1.0),
        detail: format!("{} ({vial} against {peer})", times(ratio)),
    }
}

/// `op`'s vial row under `bound` seconds.
fn under(run: &VolumeRun, label: &str, op: &str, bound: f64) -> Goal {
    let seconds = vial_row(&run.rows, op).and_then(|r| r.seconds);
    Goal {
        goal: format!("{label}: {op} < {bound} s"),
        pass: seconds.map(|s| s < bound),
        detail: format!("{} s", num(seconds, 3)),
    }
}

/// No process held more than the limit, and none ran out.
fn descriptors(run: &VolumeRun, label: &str) -> Goal {
    let most = run.rows.iter().filter_map(|r| r.fds).max();
    let out: Vec<&str> = run
        .rows
        .iter()
        .filter(|r| r.emfile)
        .map(|r| r.client)
        .collect();
    Goal {
        goal: format!("{label}: open descriptors <= {NOFILE}, none ran out"),
        pass: most.map(|m| m <= NOFILE && out.is_empty()),
        detail: if out.is_empty() {
            format!("most {}", most.map_or("n/a".into(), |m| m.to_string()))
        } else {
            format!("ran out: {}", out.join(", "))
        },
    }
}

pub(super) fn report(results: &mut Results) {
    let mut goals = Vec::new();
    for run in &results.runs {
        print_run(run);
        let label = format!("{}, {}", run.volume, run.backend);
        goals.push(faster(
            run,
            &label,
            PUSH,
            TARBALL,
            "vial push vs tar + push",
        ));
        goals.push(faster(
            run,
            &label,
            PULL,
            TARBALL,
            "vial pull vs pull + tar -xf",
        ));
        goals.push(faster(
            run,
            &label,
            READ,
            PULL_READ,
            "read through a cold mount vs pull + read",
        ));
        goals.push(under(run, &label, MOUNT_OP, MOUNT_SECONDS));
        goals.push(under(run, &label, LS_OP, LS_SECONDS));
        goals.push(descriptors(run, &label));
    }
    print_goal_list(
        &goals,
        &[
            "#48 states the goals for the 100,000-file volume; every volume is held to them here"
                .to_owned(),
        ],
    );
    results.goals = goals;
}
