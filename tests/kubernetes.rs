//! The Kubernetes manifests (deploy/kubernetes), rendered by kustomize as `kubectl apply -k`
//! renders them, and every command line in them run here as its pod would run it: the registry's
//! replicas on real PostgreSQL and S3 with the environment its Secret documents, answering their
//! probes and serving each other's pushes; the cache tier's replicas in front of them, as peers;
//! the node agent's init container installing containerd's drop-in, which containerd 2.x loads,
//! and its snapshotter, which containerd reaches through it and which stops cleanly on SIGTERM.
//! The drop-in must be the block `vial snapshotter --print-containerd-config` prints for the
//! DaemonSet's flags.
//!
//! A pod's paths and addresses are its own: the test maps each mount path and listen address to
//! one of its own, and fails if a manifest names an address no Service in them gives.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_yaml::Value;

use crate::support::cri::{containerd2_dir, wait_for};
use crate::support::postgres::PgCluster;
use crate::support::s3::{S3Server, BUCKET};
use crate::support::vial::{assert_same_tree, push_json, vial_ok};
use crate::support::{backend, free_port, peer, run, signal, vial_bin, wait_timeout};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `kustomize build deploy/kubernetes`, as documents; `None` without kustomize (a skip, or a
/// failure under VIAL_TEST_REQUIRE_ALL=1). `scripts/fetch-unstable` puts it in .ci/tools.
fn render() -> Option<Vec<Value>> {
    let bundled = repo_root().join(".ci/tools/kustomize/bin/kustomize");
    let bin = if bundled.is_file() {
        bundled
    } else {
        peer("kustomize")?
    };
    let yaml = run(Command::new(bin)
        .arg("build")
        .arg(repo_root().join("deploy/kubernetes")));
    Some(
        serde_yaml::Deserializer::from_str(&yaml)
            .map(|doc| Value::deserialize(doc).unwrap())
            .collect(),
    )
}

fn text(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, found {v:?}"))
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("the manifests have no {kind} {name}"))
}

fn container<'a>(workload: &'a Value, list: &str, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"][list]
        .as_sequence()
        .and_then(|cs| cs.iter().find(|c| c["name"].as_str() == Some(name)))
        .unwrap_or_else(|| panic!("no {list} entry named {name}"))
}

/// A Service's in-cluster address, `http://NAME:PORT`.
fn service_url(docs: &[Value], name: &str) -> String {
    let service = find(docs, "Service", name);
    let port = service["spec"]["ports"][0]["port"].as_u64().unwrap();
    format!("http://{name}:{port}")
}

/// What a container's process is given, with the pod's paths and addresses replaced by the test's.
struct Pod {
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

impl Pod {
    /// `container`'s command line and literal environment, with each `(from, to)` replaced; every
    /// `from` must occur somewhere (a mapping that matches nothing means the manifests changed
    /// under the test).
    fn of(container: &Value, map: &[(String, String)]) -> Pod {
        let mut argv: Vec<String> = ["command", "args"]
            .iter()
            .filter_map(|k| container[*k].as_sequence())
            .flatten()
            .map(|v| text(v).to_owned())
            .collect();
        let mut env: Vec<(String, String)> = container["env"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|e| (text(&e["name"]).to_owned(), text(&e["value"]).to_owned()))
            .collect();
        for (from, to) in map {
            let mut used = false;
            for s in argv.iter_mut().chain(env.iter_mut().map(|(_, v)| v)) {
                if s.contains(from.as_str()) {
                    *s = s.replace(from.as_str(), to);
                    used = true;
                }
            }
            assert!(used, "{from} occurs nowhere in {argv:?} {env:?}");
        }
        Pod { argv, env }
    }

    /// Starts the process (`vial` is the binary under test), its output in `log`.
    fn start(&self, extra_env: &[(String, String)], log: &Path) -> Running {
        let program = match self.argv[0].as_str() {
            "vial" => vial_bin(),
            other => PathBuf::from(other),
        };
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new(program)
            .args(&self.argv[1..])
            .envs(self.env.iter().cloned())
            .envs(extra_env.iter().cloned())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {:?}: {e}", self.argv));
        Running {
            child,
            log: log.to_owned(),
        }
    }
}

/// A running container process, killed if the test fails before stopping it.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Running {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, as the kubelet stops a pod: the process must exit cleanly.
    fn stop(mut self) {
        signal(self.child.id(), "TERM");
        let status = wait_timeout(&mut self.child, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("did not stop within 30 s of SIGTERM\n{}", self.log()));
        assert!(status.success(), "{status} after SIGTERM\n{}", self.log());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `url` answers 200, as an httpGet probe.
fn probe(url: &str, running: &mut Running) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let client = reqwest::blocking::Client::new();
    loop {
        if client
            .get(url)
            .send()
            .is_ok_and(|r| r.status().is_success())
        {
            return;
        }
        if let Ok(Some(status)) = running.child.try_wait() {
            panic!(
                "exited with {status} before {url} answered\n{}",
                running.log()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{url} never answered 200\n{}",
            running.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The paths of a container's httpGet probes (readiness first).
fn probe_paths(container: &Value) -> Vec<String> {
    ["readinessProbe", "livenessProbe"]
        .iter()
        .map(|p| text(&container[*p]["httpGet"]["path"]).to_owned())
        .collect()
}

#[test]
fn the_manifests_render_and_every_command_line_in_them_runs_against_postgres_and_s3() {
    // The manifests name their own backends: this runs once, in the embedded pass of the matrix.
    if backend() != (false, false) {
        return;
    }
    let Some(docs) = render() else { return };
    for doc in &docs {
        assert_eq!(
            doc["metadata"]["namespace"].as_str(),
            Some("vial"),
            "{doc:?}"
        );
    }
    let (Some(pg), Some(s3)) = (PgCluster::start(), S3Server::start()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let listen = "0.0.0.0:5000";

    // The registry: its replicas, with the Secret its comment documents.
    let registry = find(&docs, "Deployment", "vial-registry");
    let replicas = registry["spec"]["replicas"].as_u64().unwrap();
    assert!(replicas >= 2, "the registry runs replicas side by side");
    let server = container(registry, "containers", "registry");
    assert_eq!(
        text(&server["envFrom"][0]["secretRef"]["name"]),
        "vial-registry"
    );
    let mut secret: Vec<(String, String)> = vec![
        ("VIAL_METADATA_URL".into(), pg.database("vial")),
        ("VIAL_BLOB_URL".into(), format!("s3://{BUCKET}/vial")),
    ];
    secret.extend(s3.env().into_iter().map(|(k, v)| (k.to_owned(), v)));
    let mut registries = Vec::new();
    for i in 0..replicas {
        let addr = format!("127.0.0.1:{}", free_port());
        let pod = Pod::of(
            server,
            &[
                (listen.to_owned(), addr.clone()),
                (
                    "/var/lib/vial".to_owned(),
                    d.join(format!("registry-{i}")).display().to_string(),
                ),
            ],
        );
        let mut running = pod.start(&secret, &d.join(format!("registry-{i}.log")));
        for path in probe_paths(server) {
            probe(&format!("http://{addr}{path}"), &mut running);
        }
        registries.push((addr, running));
    }
    let log = registries[0].1.log();
    assert!(
        log.lines()
            .any(|l| l.starts_with('{') && l.contains("listening")),
        "JSON logs: {log}"
    );

    // A push through one replica is served by the other: they share only the two stores.
    let home = d.join("home");
    let src = d.join("model");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("config.json"), br#"{"layers": 2}"#).unwrap();
    std::fs::write(
        src.join("weights.bin"),
        crate::support::oci::pseudo_random(3 << 20, 5),
    )
    .unwrap();
    push_json(
        &home,
        &src,
        &format!("{}/weights/k8s", registries[0].0),
        &["--tag", "v1"],
    );
    let pulled = d.join("pulled");
    vial_ok(
        &home,
        &[
            "pull",
            &format!("{}/weights/k8s:v1", registries[1].0),
            pulled.to_str().unwrap(),
        ],
    );
    assert_same_tree(&src, &pulled);

    // The cache tier: its replicas reach the registry's Service and each other by the
    // StatefulSet's stable names.
    let cache = find(&docs, "StatefulSet", "vial-cache");
    let cache_replicas = cache["spec"]["replicas"].as_u64().unwrap();
    let peers_service = text(&cache["spec"]["serviceName"]);
    find(&docs, "Service", peers_service);
    let cache_addrs: Vec<String> = (0..cache_replicas)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let cache_container = container(cache, "containers", "cache");
    let mut caches = Vec::new();
    for (i, addr) in cache_addrs.iter().enumerate() {
        let mut map = vec![
            (listen.to_owned(), addr.clone()),
            (
                service_url(&docs, "vial-registry"),
                format!("http://{}", registries[0].0),
            ),
            (
                "/var/lib/vial".to_owned(),
                d.join(format!("cache-{i}")).display().to_string(),
            ),
        ];
        for (j, peer_addr) in cache_addrs.iter().enumerate() {
            map.push((
                format!("http://vial-cache-{j}.{peers_service}:5000"),
                format!("http://{peer_addr}"),
            ));
        }
        let pod = Pod::of(cache_container, &map);
        let mut running = pod.start(&[], &d.join(format!("cache-{i}.log")));
        for path in probe_paths(cache_container) {
            probe(&format!("http://{addr}{path}"), &mut running);
        }
        caches.push(running);
    }
    let through_cache = d.join("through-cache");
    vial_ok(
        &home,
        &[
            "pull",
            &format!("{}/weights/k8s:v1", cache_addrs[1]),
            through_cache.to_str().unwrap(),
        ],
    );
    assert_same_tree(&src, &through_cache);

    // The node agent. Its drop-in is what `vial snapshotter` prints for the DaemonSet's flags.
    let node = find(&docs, "DaemonSet", "vial-node");
    let snapshotter = container(node, "containers", "snapshotter");
    assert_eq!(
        snapshotter["securityContext"]["privileged"].as_bool(),
        Some(true)
    );
    let argv: Vec<&str> = snapshotter["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    let flag = |name: &str| {
        let at = argv.iter().position(|a| *a == name).unwrap();
        argv[at + 1]
    };
    let printed = run(Command::new(vial_bin()).args([
        "snapshotter",
        "--print-containerd-config",
        "--address",
        flag("--address"),
        "--root",
        flag("--root"),
    ]));
    let dropin = text(&find(&docs, "ConfigMap", "vial-containerd")["data"]["vial.toml"]);
    assert!(
        dropin.contains(&printed),
        "the containerd drop-in is not the block `vial snapshotter` prints:\n{dropin}\n---\n{printed}"
    );
    // The root and the node cache share one host path: kubelet's image filesystem is the one
    // the cache fills.
    let state = snapshotter["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str() == Some("vial-state"))
        .unwrap();
    assert_eq!(text(&state["mountPropagation"]), "Bidirectional");
    let state_path = text(&state["mountPath"]);
    assert!(flag("--root").starts_with(state_path) && flag("--cache-dir").starts_with(state_path));

    // The init container installs the drop-in on the host.
    let init = container(node, "initContainers", "containerd-config");
    let config_map_dir = d.join("configmap");
    std::fs::create_dir_all(&config_map_dir).unwrap();
    std::fs::write(config_map_dir.join("vial.toml"), dropin).unwrap();
    let host_etc = d.join("host-etc-containerd");
    let mut map = Vec::new();
    for m in init["volumeMounts"].as_sequence().unwrap() {
        let to = match text(&m["name"]) {
            "containerd-config" => config_map_dir.clone(),
            "host-containerd-etc" => host_etc.clone(),
            other => panic!("unexpected mount {other} in the init container"),
        };
        map.push((text(&m["mountPath"]).to_owned(), to.display().to_string()));
    }
    let install = Pod::of(init, &map);
    run(Command::new(&install.argv[0]).args(&install.argv[1..]));
    let installed = host_etc.join("conf.d/vial.toml");
    assert_eq!(std::fs::read_to_string(&installed).unwrap(), dropin);

    // The snapshotter, its host paths mapped to the test's, stopped as the kubelet stops it.
    let mut map = Vec::new();
    for m in snapshotter["volumeMounts"].as_sequence().unwrap() {
        let name = text(&m["name"]);
        if ["vial-state", "vial-run"].contains(&name) {
            map.push((
                text(&m["mountPath"]).to_owned(),
                d.join(name).display().to_string(),
            ));
        }
    }
    let pod = Pod::of(snapshotter, &map);
    let running = pod.start(&[], &d.join("snapshotter.log"));
    let socket = d.join("vial-run/snapshotter.sock");
    wait_for(&socket, "the snapshotter");
    // Its readiness probe (the socket exists) passes.
    let readiness = &snapshotter["readinessProbe"]["exec"];
    let run_dir: Vec<(String, String)> = map
        .iter()
        .filter(|(from, _)| flag("--address").starts_with(from.as_str()))
        .cloned()
        .collect();
    let check = Pod::of(readiness, &run_dir);
    run(Command::new(&check.argv[0]).args(&check.argv[1..]));

    // containerd 2.x imports the installed drop-in (its paths mapped like the pod's) and reaches
    // the snapshotter through it.
    if let Some(bin) = containerd2_dir() {
        let mapped = d.join("containerd-conf.d");
        std::fs::create_dir_all(&mapped).unwrap();
        let mut text = std::fs::read_to_string(&installed).unwrap();
        for (from, to) in &map {
            text = text.replace(from.as_str(), to);
        }
        std::fs::write(mapped.join("vial.toml"), text).unwrap();
        let sock = d.join("containerd.sock");
        std::fs::write(
            d.join("containerd.toml"),
            format!(
                r#"version = 3
root = "{root}"
state = "{state}"
imports = ["{imports}/*.toml"]
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
"#,
                root = d.join("containerd-root").display(),
                state = d.join("containerd-state").display(),
                imports = mapped.display(),
                sock = sock.display(),
            ),
        )
        .unwrap();
        let containerd = Pod {
            argv: vec![
                bin.join("containerd").display().to_string(),
                "--config".into(),
                d.join("containerd.toml").display().to_string(),
            ],
            env: Vec::new(),
        }
        .start(&[], &d.join("containerd.log"));
        wait_for(&sock, "containerd 2.x");
        let ctr = |args: &[&str]| {
            run(Command::new(bin.join("ctr"))
                .arg("--address")
                .arg(&sock)
                .args(args))
        };
        let plugins = ctr(&["plugins", "ls"]);
        assert!(
            plugins
                .lines()
                .any(|l| l.contains("io.containerd.snapshotter.v1")
                    && l.contains("vial")
                    && l.contains("ok")),
            "containerd did not load vial's proxy plugin from the drop-in:\n{plugins}\n{}",
            containerd.log()
        );
        ctr(&["snapshots", "--snapshotter", "vial", "ls"]);
        drop(containerd);
    }
    running.stop();
    assert!(!socket.exists(), "the socket outlived a clean stop");

    for running in caches {
        running.stop();
    }
    for (_, running) in registries {
        running.stop();
    }
}
