//! The mount benchmark's report: its tables, its goals and the notes that explain the figures.

use super::results::*;
use crate::mounted;
use crate::report::{num, ratio, si, table, times, Goal};

fn row_of<'a>(run: &'a SizeRun, key: &str) -> Option<&'a ReadRow> {
    run.reads.iter().find(|x| x.key == key)
}

fn mb_s(run: &SizeRun, key: &str) -> Option<f64> {
    row_of(run, key).filter(|x| x.error.is_none())?.mb_s
}

fn mib_kib(k: Option<u64>) -> String {
    num(k.map(|k| k as f64 / 1024.0), 1)
}

pub(super) fn print_tables(r: &MountResults) {
    let sizes = &r.sizes;
    let rows: Vec<Vec<String>> = sizes
        .iter()
        .map(|s| {
            let ms: Vec<f64> = s.mounts.iter().map(|m| m.mount_ms).collect();
            let lo = ms.iter().copied().reduce(f64::min);
            let hi = ms.iter().copied().reduce(f64::max);
            vec![
                size_label(s.size_gib),
                format!("{} ({} MB)", s.files, num(Some(s.bytes as f64 / 1e6), 0)),
                num(s.mount_ms_median, 1),
                format!("{}–{}", num(lo, 1), num(hi, 1)),
                num(s.mount_ls_ms_median, 1),
                num(s.mount_warm_cache_ms, 1),
                mib_kib(s.mounts.last().and_then(|m| m.rss_kib)),
            ]
        })
        .collect();
    let runs = sizes.first().map_or(0, |s| s.mounts.len());
    table(
        &format!(
            "1. Mount time (ms; median of {runs} mounts, each on a fresh empty cache; `vial mount` \
             start to exit = ready)"
        ),
        &[
            "volume",
            "files",
            "mount",
            "min–max",
            "mount + ls -lR",
            "mount, warm cache",
            "RSS after ls MiB",
        ],
        &rows,
    );
    if let (Some(a), Some(b)) = (sizes.first(), sizes.last()) {
        if sizes.len() > 1 {
            println!(
                "  mount time {} / {}: {}   (mount + ls -lR: {})",
                size_label(b.size_gib),
                size_label(a.size_gib),
                times(ratio(b.mount_ms_median, a.mount_ms_median)),
                times(ratio(b.mount_ls_ms_median, a.mount_ls_ms_median))
            );
        }
    }

    let ra: Vec<String> = sizes
        .iter()
        .map(|s| {
            format!(
                "{} KiB ({})",
                s.read_ahead_kb.map_or("n/a".into(), |k| k.to_string()),
                size_label(s.size_gib)
            )
        })
        .collect();
    println!(
        "  kernel readahead on the mount (/sys/class/bdi/MAJ:MIN/read_ahead_kb): {}",
        ra.join(", ")
    );

    let rows: Vec<Vec<String>> = sizes
        .iter()
        .filter_map(|s| {
            let t = s.first_tensor.as_ref()?;
            let fetched = t.stats.as_ref().map(|x| x.bytes_fetched);
            let chunks = t.stats.as_ref().map(|x| x.chunks_fetched);
            Some(vec![
                size_label(s.size_gib),
                format!(
                    "{} ({:.1} MiB @ {:.0}%)",
                    t.read.tensor,
                    t.read.tensor_bytes as f64 / MIB,
                    t.read.tensor_offset as f64 * 100.0 / t.read.file_bytes.max(1) as f64
                ),
                num(Some(t.mount_ms), 1),
                num(Some(t.read.header_ms), 1),
                num(Some(t.read.tensor_ms), 1),
                num(Some(t.read.header_and_tensor_ms), 1),
                num(Some(t.mount_to_tensor_ms), 1),
                si(t.stats.as_ref().map(|x| x.bytes_read)),
                format!(
                    "{} in {} chunks",
                    si(fetched),
                    chunks.map_or("n/a".into(), |c| c.to_string())
                ),
                times(ratio(
                    fetched.map(|f| f as f64),
                    Some((t.read.tensor_bytes + t.read.header_bytes) as f64),
                )),
                format!(
                    "{:.2}%",
                    fetched.unwrap_or(0) as f64 * 100.0 / s.bytes.max(1) as f64
                ),
            ])
        })
        .collect();
    table(
        "2. Time to first tensor (ms; fresh mount, empty cache; the header of the last shard, then \
         one tensor from its middle in one pread)",
        &[
            "volume",
            "tensor (size @ offset in file)",
            "mount",
            "header",
            "tensor",
            "header+tensor",
            "mount→tensor",
            "daemon read",
            "fetched",
            "fetched/(header+tensor)",
            "of volume",
        ],
        &rows,
    );

    let cold_keys = [MOUNT_NONE, MOUNT_ALL, PULL, SKOPEO, LOCAL_COLD];
    let mut rows = Vec::new();
    for s in sizes {
        for key in cold_keys {
            let Some(x) = row_of(s, key) else { continue };
            rows.push(vec![
                size_label(s.size_gib),
                x.label.clone(),
                num(x.seconds, 2),
                num(x.mb_s, 1),
                times(ratio(x.mb_s, mb_s(s, PULL))),
                times(ratio(x.mb_s, mb_s(s, SKOPEO))),
                si(x.fetched),
                si(x.registry_bytes_sent),
                num(x.mount_cpu_seconds, 2),
                x.error
                    .as_deref()
                    .map_or(String::new(), |e| first_line(e).to_string()),
            ]);
        }
    }
    table(
        &format!(
            "3. Cold full read of every file (MB/s = volume bytes / seconds, 10^6; {}; {} file(s) \
             at a time, {} MiB reads)",
            if r.drop_caches.permitted {
                "page cache dropped before each row"
            } else {
                "page cache NOT dropped"
            },
            r.readers,
            mounted::READ_BUF >> 20
        ),
        &[
            "volume",
            "how",
            "seconds",
            "MB/s",
            "/pull",
            "/skopeo",
            "fetched",
            "registry sent",
            "mount CPU s",
            "error",
        ],
        &rows,
    );

    let warm_keys = [
        PAGE_CACHE,
        DAEMON,
        NODE_CACHE,
        NODE_CACHE_DROPPED,
        LOCAL_WARM,
    ];
    let mut rows = Vec::new();
    for s in sizes {
        for key in warm_keys {
            let Some(x) = row_of(s, key) else { continue };
            let base = if key == NODE_CACHE_DROPPED {
                mb_s(s, LOCAL_COLD)
            } else {
                mb_s(s, LOCAL_WARM)
            };
            rows.push(vec![
                size_label(s.size_gib),
                x.label.clone(),
                num(x.seconds, 2),
                num(x.mb_s, 1),
                times(ratio(x.mb_s, base)),
                si(x.fetched),
                si(x.daemon_bytes_read),
                num(x.mount_cpu_seconds, 2),
                x.error
                    .as_deref()
                    .map_or(String::new(), |e| first_line(e).to_string()),
            ]);
        }
    }
    table(
        "4. Warm read of every file (MB/s; ratio against local disk warm, or cold for the \
         page-cache-dropped row; daemon read = bytes the kernel asked the mount process for)",
        &[
            "volume",
            "how",
            "seconds",
            "MB/s",
            "/local",
            "fetched",
            "daemon read",
            "mount CPU s",
            "error",
        ],
        &rows,
    );

    let mut rows = Vec::new();
    for s in sizes {
        for x in &s.rss {
            rows.push(vec![
                size_label(s.size_gib),
                x.phase.clone(),
                mib_kib(x.after_mount_kib),
                mib_kib(x.peak_kib),
                mib_kib(x.hwm_kib),
            ]);
        }
    }
    table(
        "5. Memory of the mount process (MiB; VmRSS after mount, peak VmRSS sampled every 50 ms \
         while reading, VmHWM at the end)",
        &[
            "volume",
            "mount process",
            "after mount",
            "peak reading",
            "VmHWM",
        ],
        &rows,
    );
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn goal(goals: &mut Vec<Goal>, name: String, pass: Option<bool>, detail: String) {
    goals.push(Goal {
        goal: name,
        pass,
        detail,
    });
}

pub(super) fn evaluate(r: &MountResults) -> Vec<Goal> {
    let mut g = Vec::new();
    for s in &r.sizes {
        let l = size_label(s.size_gib);
        goal(
            &mut g,
            format!("{l}: mount < 200 ms"),
            s.mount_ms_median.map(|x| x < 200.0),
            format!("{} ms median", num(s.mount_ms_median, 1)),
        );
    }
    if let (Some(a), Some(b)) = (r.sizes.first(), r.sizes.last()) {
        if r.sizes.len() > 1 {
            let x = ratio(b.mount_ms_median, a.mount_ms_median);
            goal(
                &mut g,
                format!(
                    "mount time {} / {} < 1.5",
                    size_label(b.size_gib),
                    size_label(a.size_gib)
                ),
                x.map(|x| x < 1.5),
                times(x),
            );
        }
    }
    for s in &r.sizes {
        let l = size_label(s.size_gib);
        let t = s.first_tensor.as_ref();
        goal(
            &mut g,
            format!("{l}: first tensor < 100 ms"),
            t.map(|t| t.read.tensor_ms < 100.0),
            t.map_or("not measured".into(), |t| {
                format!(
                    "tensor {:.1} ms, header+tensor {:.1} ms ({:.1} MiB)",
                    t.read.tensor_ms,
                    t.read.header_and_tensor_ms,
                    t.read.tensor_bytes as f64 / MIB
                )
            }),
        );
    }
    for s in &r.sizes {
        let l = size_label(s.size_gib);
        // (what is read, against what, the goal's wording, the smallest ratio that passes)
        let rows = [
            (
                MOUNT_NONE,
                PULL,
                "cold mount read (prefetch none)",
                "vial pull",
                0.9,
            ),
            (
                MOUNT_ALL,
                PULL,
                "cold mount read (prefetch all)",
                "vial pull",
                0.9,
            ),
            (
                PAGE_CACHE,
                LOCAL_WARM,
                "warm read (page cache)",
                "local disk (warm)",
                0.7,
            ),
            (
                NODE_CACHE,
                LOCAL_WARM,
                "warm read (node cache, new mount)",
                "local disk (warm)",
                0.7,
            ),
            // Both from the disk: the node cache's chunk files against the original files.
            (
                NODE_CACHE_DROPPED,
                LOCAL_COLD,
                "warm read (node cache, page cache dropped)",
                "local disk (cold)",
                0.7,
            ),
        ];
        for (key, against, what, against_what, min) in rows {
            let (m, p) = (mb_s(s, key), mb_s(s, against));
            let x = ratio(m, p);
            goal(
                &mut g,
                format!("{l}: {what} >= {min}x {against_what}"),
                x.map(|x| x >= min),
                format!("{} ({} vs {} MB/s)", times(x), num(m, 1), num(p, 1)),
            );
        }
    }
    g
}

pub(super) fn notes(r: &mut MountResults) {
    let mut n = Vec::new();
    n.push(
        "registry, clients and mounts share this machine's cores; the registry is on loopback"
            .to_string(),
    );
    n.push(format!(
        "cold rows: {}; mount rows count from `vial mount` start to the last byte read, pull and \
         skopeo are the process's wall time",
        if r.drop_caches.permitted {
            "`sync; echo 3 > /proc/sys/vm/drop_caches` before each (registry data read from disk)"
        } else {
            "the page cache could not be dropped, so the registry's data may come from memory"
        }
    ));
    n.push(
        "skopeo copies the same files pushed as an OCI image with one uncompressed layer per file \
         (--preserve-digests); it writes blobs, not the files"
            .into(),
    );
    for s in &r.sizes {
        if let (Some(p), Some(m)) = (&s.pinned, &s.mounted_reference) {
            if p != m {
                n.push(format!(
                    "{}: vial push reported {p} but vial mount printed {m}",
                    size_label(s.size_gib)
                ));
            }
        }
        for e in &s.errors {
            n.push(format!("{}: {}", size_label(s.size_gib), first_line(e)));
        }
        for x in &s.reads {
            if let Some(e) = &x.error {
                n.push(format!(
                    "{}: {}: {}",
                    size_label(s.size_gib),
                    x.label,
                    first_line(e)
                ));
            }
            if let Some(st) = &x.stats {
                if st.fetch_errors > 0 || st.evictions > 0 {
                    n.push(format!(
                        "{}: {}: {} fetch errors, {} evictions",
                        size_label(s.size_gib),
                        x.label,
                        st.fetch_errors,
                        st.evictions
                    ));
                }
            }
            let over = x.fetched.zip(x.bytes_read).filter(|(f, b)| *f > b + b / 20);
            if let (Some((f, b)), true) = (over, x.key.starts_with("mount")) {
                n.push(format!(
                    "{}: {}: fetched {} for {} read",
                    size_label(s.size_gib),
                    x.label,
                    si(Some(f)),
                    si(Some(b))
                ));
            }
        }
    }
    r.notes.extend(n);
}
