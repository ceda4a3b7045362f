//! The benchmark's figures (serialised with `--json`), the tables printed per section, and the
//! goals evaluated against them.

use serde::Serialize;

use crate::manifests::Latency;
use crate::rss::RssPush;

const MIB: f64 = 1024.0 * 1024.0;

/// Picks one percentile out of a latency record.
type LatencyField = fn(&Latency) -> f64;

/// A figure for vial and for the peer registry; `None` where the measurement failed.
#[derive(Clone, Debug, Serialize)]
pub struct Pair<T> {
    pub vial: Option<T>,
    pub peer: Option<T>,
}

impl<T> Default for Pair<T> {
    fn default() -> Self {
        Pair {
            vial: None,
            peer: None,
        }
    }
}

#[derive(Debug, Default, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub date: String,
    pub kernel: String,
}

#[derive(Debug, Default, Serialize)]
pub struct Versions {
    pub vial: String,
    pub peer: String,
    pub nginx: String,
    pub curl: String,
}

/// Throughput of one blob size class, MB/s (10^6 bytes/s); pulls keep every run and the median.
#[derive(Debug, Serialize)]
pub struct Throughput {
    pub label: String,
    pub blob_bytes: u64,
    pub blobs: usize,
    pub concurrency: usize,
    pub runs: Pair<Vec<f64>>,
    pub mb_s: Pair<f64>,
}

#[derive(Debug, Default, Serialize)]
pub struct CurlPull {
    pub blob_bytes: u64,
    pub runs: Pair<Vec<f64>>,
    pub nginx_runs: Vec<f64>,
    pub mb_s: Pair<f64>,
    pub nginx_mb_s: Option<f64>,
}

#[derive(Debug, Default, Serialize)]
pub struct Manifests {
    pub clients: usize,
    pub per_client: usize,
    pub latency: Pair<Latency>,
}

#[derive(Debug, Serialize)]
pub struct Goal {
    pub goal: String,
    pub pass: Option<bool>,
    pub detail: String,
}

#[derive(Debug, Default, Serialize)]
pub struct Results {
    pub machine: Machine,
    pub versions: Versions,
    pub quick: bool,
    pub workdir: String,
    pub push: Vec<Throughput>,
    pub pull: Vec<Throughput>,
    pub curl_pull: CurlPull,
    pub manifests: Manifests,
    /// VmHWM after sections 1-3, KiB.
    pub peak_rss_kib: Pair<u64>,
    pub rss_push: Vec<RssPush>,
    pub notes: Vec<String>,
    pub goals: Vec<Goal>,
}

/// Median of the finite runs.
pub fn median(runs: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = runs.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b?).filter(|r| r.is_finite())
}

pub fn num(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".into(), |x| format!("{x:.decimals$}"))
}

pub fn times(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |x| format!("{x:.2}x"))
}

fn mib(kib: Option<u64>) -> Option<f64> {
    kib.map(|k| k as f64 * 1024.0 / MIB)
}

pub fn table(title: &str, header: &[&str], rows: &[Vec<String>]) {
    println!("\n== {title}");
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        println!("  {}", parts.join(" | ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    println!(
        "  {}",
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("-+-")
    );
    for row in rows {
        line(row.clone());
    }
}

fn throughput_rows(rows: &[Throughput]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|t| {
            vec![
                format!(
                    "{} x {} ({} client{})",
                    t.blobs,
                    t.label,
                    t.concurrency,
                    if t.concurrency == 1 { "" } else { "s" }
                ),
                num(t.mb_s.vial, 1),
                num(t.mb_s.peer, 1),
                times(ratio(t.mb_s.vial, t.mb_s.peer)),
            ]
        })
        .collect()
}

pub fn print_tables(r: &Results, peer: &str, large: &str) {
    let head = ["blobs", "vial", peer, "vial/peer"];
    table(
        "1. Blob push, POST + PUT with body (MB/s = 10^6 bytes/s; higher is better)",
        &head,
        &throughput_rows(&r.push),
    );
    table(
        "2. Blob pull, streamed GET (MB/s, median of runs; higher is better)",
        &head,
        &throughput_rows(&r.pull),
    );
    let c = &r.curl_pull;
    table(
        &format!(
            "2b. {large} pull with curl (MB/s, median of runs; nginx+sendfile is the ceiling)"
        ),
        &["client", "vial", peer, "nginx", "vial/peer", "vial/nginx"],
        &[vec![
            "curl".into(),
            num(c.mb_s.vial, 1),
            num(c.mb_s.peer, 1),
            num(c.nginx_mb_s, 1),
            times(ratio(c.mb_s.vial, c.mb_s.peer)),
            format!(
                "{}%",
                num(ratio(c.mb_s.vial, c.nginx_mb_s).map(|x| x * 100.0), 0)
            ),
        ]],
    );
    let m = &r.manifests;
    let lat = |f: LatencyField| {
        (
            m.latency.vial.as_ref().map(f),
            m.latency.peer.as_ref().map(f),
        )
    };
    let rows: Vec<Vec<String>> = [
        ("PUT p50", lat(|l| l.put_p50_ms)),
        ("PUT p99", lat(|l| l.put_p99_ms)),
        ("GET p50", lat(|l| l.get_p50_ms)),
        ("GET p99", lat(|l| l.get_p99_ms)),
    ]
    .into_iter()
    .map(|(name, (v, p))| vec![name.into(), num(v, 2), num(p, 2), times(ratio(p, v))])
    .collect();
    table(
        &format!(
            "3. Manifest latency, {} clients x {} PUTs then {} GETs (ms; lower is better; peer/vial > 1 means vial is faster)",
            m.clients, m.per_client, m.per_client
        ),
        &["request", "vial", peer, "peer/vial"],
        &rows,
    );
    let (v, p) = (mib(r.peak_rss_kib.vial), mib(r.peak_rss_kib.peer));
    table(
        "4. Peak RSS (VmHWM) after sections 1-3 (MiB; lower is better; peer/vial > 1 means vial uses less)",
        &["", "vial", peer, "peer/vial"],
        &[vec!["VmHWM".into(), num(v, 1), num(p, 1), times(ratio(p, v))]],
    );
    if let Some(first) = r.rss_push.first() {
        let rows: Vec<Vec<String>> = r
            .rss_push
            .iter()
            .map(|x| {
                vec![
                    x.server.clone(),
                    num(mib(Some(x.max_vmrss_kib)), 1),
                    num(mib(Some(x.vmhwm_kib)), 1),
                    num(Some(x.aggregate_mb_s), 1),
                    format!("{:.1}", x.elapsed_s),
                ]
            })
            .collect();
        table(
            &format!(
                "5. {} clients each pushing a distinct {:.0} MiB blob at once (fresh server; RSS sampled every 100 ms)",
                first.clients,
                first.blob_bytes as f64 / MIB
            ),
            &["server", "max VmRSS MiB", "VmHWM MiB", "aggregate MB/s", "seconds"],
            &rows,
        );
    }
}

fn goal(goals: &mut Vec<Goal>, name: String, pass: Option<bool>, detail: String) {
    goals.push(Goal {
        goal: name,
        pass,
        detail,
    });
}

/// Evaluates the goals and stores them in `r.goals`.
pub fn evaluate(r: &mut Results, large: &str) {
    let mut g = Vec::new();
    for t in &r.push {
        let x = ratio(t.mb_s.vial, t.mb_s.peer);
        goal(
            &mut g,
            format!("push {} >= 1.2x peer", t.label),
            x.map(|x| x >= 1.2),
            times(x),
        );
    }
    for t in &r.pull {
        let x = ratio(t.mb_s.vial, t.mb_s.peer);
        goal(
            &mut g,
            format!("pull {} >= 1.0x peer", t.label),
            x.map(|x| x >= 1.0),
            times(x),
        );
    }
    let c = &r.curl_pull;
    let x = ratio(c.mb_s.vial, c.mb_s.peer);
    goal(
        &mut g,
        format!("curl pull {large} >= 1.0x peer"),
        x.map(|x| x >= 1.0),
        times(x),
    );
    let x = ratio(c.mb_s.vial, c.nginx_mb_s);
    let pct = format!("{}% of nginx", num(x.map(|x| x * 100.0), 0));
    goal(
        &mut g,
        format!("curl pull {large} >= 80% of nginx"),
        x.map(|x| x >= 0.8),
        pct,
    );
    let (v, p) = (
        r.manifests.latency.vial.as_ref(),
        r.manifests.latency.peer.as_ref(),
    );
    let fields: [(&str, LatencyField); 4] = [
        ("manifest PUT p50", |l| l.put_p50_ms),
        ("manifest PUT p99", |l| l.put_p99_ms),
        ("manifest GET p50", |l| l.get_p50_ms),
        ("manifest GET p99", |l| l.get_p99_ms),
    ];
    for (name, f) in fields {
        let (a, b) = (v.map(f), p.map(f));
        let pass = a.zip(b).map(|(a, b)| a <= b);
        goal(
            &mut g,
            format!("{name} <= peer's"),
            pass,
            format!("{} ms vs {} ms", num(a, 2), num(b, 2)),
        );
    }
    match r.rss_push.iter().find(|x| x.server == "vial") {
        Some(x) => {
            let worst = mib(Some(x.vmhwm_kib.max(x.max_vmrss_kib))).unwrap_or(f64::NAN);
            let name = format!("vial RSS < 150 MiB under {}-client push", x.clients);
            goal(
                &mut g,
                name,
                Some(worst < 150.0),
                format!("VmHWM {worst:.1} MiB"),
            );
        }
        None => goal(
            &mut g,
            "vial RSS < 150 MiB under N-client push".into(),
            None,
            "not run".into(),
        ),
    }
    r.goals = g;
}

pub fn print_goals(r: &Results) {
    print_goal_list(&r.goals, &r.notes);
}

/// Prints PASS, MISS or n/a for each goal, then the notes.
pub fn print_goal_list(goals: &[Goal], notes: &[String]) {
    println!("\n== goals (a report, not a test)");
    let width = goals.iter().map(|g| g.goal.len()).max().unwrap_or(0);
    for g in goals {
        let mark = match g.pass {
            Some(true) => "PASS",
            Some(false) => "MISS",
            None => "n/a ",
        };
        println!("  {mark}  {:<width$}  {}", g.goal, g.detail);
    }
    for note in notes {
        println!("  note: {note}");
    }
}

/// Bytes in SI units, as MB/s is.
pub fn si(bytes: Option<u64>) -> String {
    let Some(b) = bytes else {
        return "n/a".into();
    };
    let b = b as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{b} B")
    }
}
