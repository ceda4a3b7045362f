//! The cache tier scaled out: replicas that share the work by chunk ownership, a dead peer
//! skipped, and a herd of cold nodes mounting through three replicas while one dies.

use super::*;

#[test]
fn replicas_share_the_work_and_a_dead_peer_is_skipped() {
    let tier = Tier::start(&[]);
    let ports: Vec<u16> = (0..3).map(|_| crate::support::free_port()).collect();
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let peers = urls.join(",");
    // The tier's own cache stays aside; three replicas serve.
    let mut replicas: Vec<Option<Server>> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let data = tier.home.path().join(format!("replica-{i}"));
            let addr = format!("127.0.0.1:{port}");
            Some(start_replica(
                &data,
                &tier.proxy.addr,
                &["--addr", &addr, "--peers", &peers],
            ))
        })
        .collect();
    // No waiting for the replicas to find themselves among their peers: one that asks itself
    // learns it then (508) and asks the upstream.
    tier.proxy.take_answered();
    std::thread::scope(|s| {
        for (n, replica) in replicas.iter().enumerate() {
            let (tier, addr) = (&tier, replica.as_ref().unwrap().addr.clone());
            s.spawn(move || {
                let dir = tier.home.path().join(format!("node-{n}"));
                vial_ok(
                    tier.home.path(),
                    &[
                        "pull",
                        &format!("{addr}/weights/m:v1"),
                        dir.to_str().unwrap(),
                    ],
                );
                assert_same_tree(&tier.src, &dir);
            });
        }
    });
    let asks = tier.upstream_asks();
    let repeated: Vec<_> = asks.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "each blob comes from the upstream once for all replicas: {repeated:?}"
    );
    let from_peers: u64 = replicas
        .iter()
        .map(|r| metric(r.as_ref().unwrap(), "vial_cache_peer_bytes_total"))
        .sum();
    let volume = volume_bytes(&tier.src);
    assert!(
        from_peers > volume,
        "replicas got most chunks from their owners: {from_peers} bytes from peers"
    );

    // A new version; the replica that owns the most of its chunks dies before anyone reads them;
    // another still serves all of it.
    let v2 = tier.home.path().join("v2");
    std::fs::create_dir_all(&v2).unwrap();
    std::fs::write(v2.join("c.bin"), pseudo_random(6 << 20, 7)).unwrap();
    let pushed = push_json(
        tier.home.path(),
        &v2,
        &format!("{}/weights/m", tier.origin().addr),
        &["--tag", "v2"],
    );
    let (_, v2_digest) = pushed["reference"]
        .as_str()
        .unwrap()
        .split_once('@')
        .unwrap();
    let chunks = version_chunks(&tier.origin().url(), None, "weights/m", v2_digest);
    let (victim, owned) = busiest_owner(&urls, &chunks);
    assert!(owned > 0, "some replica owns a chunk of {chunks:?}");
    replicas[victim].take().unwrap().kill_hard();
    let through = replicas[(victim + 1) % 3].as_ref().unwrap();
    let out = tier.home.path().join("after-death");
    vial_ok(
        tier.home.path(),
        &[
            "pull",
            &format!("{}/weights/m:v2", through.addr),
            out.to_str().unwrap(),
        ],
    );
    assert_same_tree(&v2, &out);
    // The death mattered: the replica read through asked the dead owner for its chunks first,
    // and went on without it.
    let log = replica_log(through);
    assert!(
        skipped_peer(&log, &urls[victim]),
        "{} never asked the dead {} for the chunks it owned ({owned} of them):\n{log}",
        through.addr,
        urls[victim]
    );
    for replica in replicas.iter().flatten() {
        crate::support::assert_no_stores_opened(replica);
    }
}

/// Three replicas; `nodes` cold nodes, each with its own node cache, mount `version` of the
/// origin through a mirror (node n through replica n mod 3) and read every file. `kill` stops a
/// replica with SIGKILL once half the nodes have mounted, and the nodes read nothing before it
/// is dead: every chunk it owns that its peers lack is asked for after its death, and every node
/// that mounted through it reads through it after its death.
fn herd(
    tier: &Tier,
    replicas: &mut [Option<Server>],
    version: &str,
    expected: &Path,
    nodes: usize,
    kill: Option<usize>,
) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let origin = tier.origin().addr.clone();
    let mirrors: Vec<String> = replicas
        .iter()
        .map(|r| format!("{origin}=http://{}", r.as_ref().unwrap().addr))
        .collect();
    let mounted = AtomicUsize::new(0);
    let killed = AtomicBool::new(kill.is_none());
    std::thread::scope(|s| {
        for n in 0..nodes {
            let (mirror, mounted, killed) = (mirrors[n % mirrors.len()].clone(), &mounted, &killed);
            let origin = origin.clone();
            let home = herd_node_home(tier, version, n);
            s.spawn(move || {
                std::fs::create_dir_all(&home).unwrap();
                // A node cache smaller than the volume keeps the herd's disk use bounded.
                let m = Mount::new(
                    &home,
                    &format!("{origin}/{version}"),
                    "mnt",
                    &["--mirror", &mirror, "--cache-size", "64MiB"],
                );
                mounted.fetch_add(1, Ordering::SeqCst);
                while !killed.load(Ordering::SeqCst) {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                assert_same_tree(expected, &m.path);
            });
        }
        if let Some(victim) = kill {
            while mounted.load(Ordering::SeqCst) < nodes / 2 {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            replicas[victim].take().unwrap().kill_hard();
            killed.store(true, Ordering::SeqCst);
        }
    });
}

/// The home directory of node `n` of the herd that reads `version`.
fn herd_node_home(tier: &Tier, version: &str, n: usize) -> PathBuf {
    tier.home
        .path()
        .join(format!("{version}-node-{n}").replace([':', '@'], "-"))
}

/// The lines of every node's mount log under `root` that speak of its mirror (a node reads from
/// the origin for a while after its mirror failed a read): why a herd cost the origin more.
fn mirror_complaints(root: &Path) -> String {
    let mut lines = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.ends_with("mnt") {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "log") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                lines.extend(
                    text.lines()
                        .filter(|l| l.contains("mirror"))
                        .map(str::to_owned),
                );
            }
        }
    }
    lines.join("\n")
}

/// A shard of the herd's volume: four make 512 MiB.
const SHARD: usize = 128 << 20;

#[test]
fn a_herd_of_cold_nodes_mounts_through_three_replicas_and_survives_one_dying() {
    if !fuse_available() {
        return;
    }
    let tier = Tier::start(&[]);
    // A 512 MiB volume in four shards.
    let volume = tier.home.path().join("herd-volume");
    std::fs::create_dir_all(&volume).unwrap();
    for shard in 0..4 {
        std::fs::write(
            volume.join(format!("model-{shard}.safetensors")),
            pseudo_random(SHARD, 100 + shard as u64),
        )
        .unwrap();
    }
    let pinned = push_json(
        tier.home.path(),
        &volume,
        &format!("{}/weights/herd", tier.origin().addr),
        &["--tag", "v1"],
    )["reference"]
        .as_str()
        .unwrap()
        .split_once('/')
        .unwrap()
        .1
        .to_owned();
    let ports: Vec<u16> = (0..3).map(|_| crate::support::free_port()).collect();
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let peers = urls.join(",");
    let mut replicas: Vec<Option<Server>> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let addr = format!("127.0.0.1:{port}");
            Some(start_replica(
                &tier.home.path().join(format!("herd-replica-{i}")),
                &tier.proxy.addr,
                &["--addr", &addr, "--peers", &peers],
            ))
        })
        .collect();
    let sent_before = metric(tier.origin(), "vial_bytes_sent_total");
    herd(&tier, &mut replicas, &pinned, &volume, 24, None);
    let sent = metric(tier.origin(), "vial_bytes_sent_total") - sent_before;
    let size = 4 * SHARD as u64;
    assert!(
        sent <= size + size / 20,
        "24 nodes through 3 replicas: the origin sent {sent} bytes for a {size}-byte volume; \
         what the nodes said of their mirrors:\n{}",
        mirror_complaints(tier.home.path())
    );

    // A new version, read by 12 more cold nodes; a replica dies once half of them have mounted.
    std::fs::write(
        volume.join("model-0.safetensors"),
        pseudo_random(16 << 20, 200),
    )
    .unwrap();
    let v2 = push_json(
        tier.home.path(),
        &volume,
        &format!("{}/weights/herd", tier.origin().addr),
        &["--tag", "v2"],
    )["reference"]
        .as_str()
        .unwrap()
        .split_once('/')
        .unwrap()
        .1
        .to_owned();
    // The victim is the replica that owns the most of the new chunks, which no replica holds
    // yet: its peers must ask it for them after its death.
    let chunks = |pinned: &str| {
        let (repo, digest) = pinned.split_once('@').unwrap();
        version_chunks(&tier.origin().url(), None, repo, digest)
    };
    let old = chunks(&pinned);
    let new: Vec<(String, u64)> = chunks(&v2)
        .into_iter()
        .filter(|c| !old.contains(c))
        .collect();
    let (victim, owned) = busiest_owner(&urls, &new);
    assert!(owned > 0, "some replica owns a new chunk of {new:?}");
    let victim_addr = replicas[victim].as_ref().unwrap().addr.clone();
    herd(&tier, &mut replicas, &v2, &volume, 12, Some(victim));
    // The death mattered to the nodes: each that mounted through the victim read after it died
    // and passed it over for the origin.
    for n in (0..12).filter(|n| n % 3 == victim) {
        let said = mirror_complaints(&herd_node_home(&tier, &v2, n));
        assert!(
            said.lines()
                .any(|l| l.contains("the mirror did not answer") && l.contains(&victim_addr)),
            "node {n} read through the dead {victim_addr} without passing it over:\n{said}"
        );
    }
    // And to the replicas: one asked the dead owner for its new chunks and went on without it.
    let logs: Vec<String> = replicas.iter().flatten().map(replica_log).collect();
    assert!(
        logs.iter().any(|log| skipped_peer(log, &urls[victim])),
        "no replica asked the dead {} for the new chunks it owned ({owned} of them):\n{}",
        urls[victim],
        logs.join("\n")
    );
}
