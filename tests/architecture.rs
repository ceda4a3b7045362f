//! The invariants ARCHITECTURE.md states about how the code is put together, checked against the
//! code itself: which crate may depend on which, which registry modules may import which, no
//! circle of files anywhere, no file over 1,000 lines. It reads the sources as text (`use` trees
//! and `crate::`/`super::` paths), so it needs nothing but the checkout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates of the workspace, by folder.
const CRATES: [&str; 8] = [
    "core",
    "io",
    "registry",
    "client",
    "snapshotter",
    "cli",
    "oras-compat",
    "conformance",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The names under `[dependencies]` of a crate's Cargo.toml (not dev- or build-dependencies).
fn dependencies(krate: &str) -> BTreeSet<String> {
    let toml = std::fs::read_to_string(root().join(krate).join("Cargo.toml")).unwrap();
    let mut inside = false;
    let mut names = BTreeSet::new();
    for line in toml.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
        } else if inside {
            if let Some((name, _)) = line.split_once('=') {
                if !name.trim().is_empty() && !name.trim().starts_with('#') {
                    names.insert(name.trim().trim_matches('"').to_owned());
                }
            }
        }
    }
    names
}

/// ARCHITECTURE.md's layers: what each crate must never depend on.
#[test]
fn each_crate_depends_only_on_what_its_layer_allows() {
    let forbidden: [(&str, &[&str]); 7] = [
        // The format: no I/O, no HTTP, SQL, S3 or FUSE, no other vial crate.
        (
            "core",
            &[
                "tokio",
                "axum",
                "hyper",
                "reqwest",
                "sqlx",
                "aws-sdk-s3",
                "fuser",
                "vial-client",
                "vial-registry",
                "vial-snapshotter",
            ],
        ),
        // Buffers and O_DIRECT writes: below every crate that moves bytes, above none.
        (
            "io",
            &[
                "tokio",
                "vial-core",
                "vial-client",
                "vial-registry",
                "vial-snapshotter",
            ],
        ),
        // Content only through a registry's HTTP API.
        (
            "client",
            &[
                "vial-registry",
                "vial-snapshotter",
                "sqlx",
                "aws-sdk-s3",
                "fuser",
            ],
        ),
        // FUSE and containerd, content through vial-client: never a database or a bucket.
        ("snapshotter", &["vial-registry", "sqlx", "aws-sdk-s3"]),
        ("registry", &["vial-snapshotter", "fuser"]),
        (
            "oras-compat",
            &["vial-client", "vial-registry", "vial-snapshotter", "tokio"],
        ),
        // The conformance suite tests the wire, not our implementation's view of itself.
        (
            "conformance",
            &["vial-client", "vial-registry", "vial-snapshotter"],
        ),
    ];
    let mut broken = Vec::new();
    for (krate, never) in forbidden {
        let deps = dependencies(krate);
        assert!(!deps.is_empty(), "{krate} has no [dependencies] to read");
        for dep in never {
            if deps.contains(*dep) {
                broken.push(format!("{krate} depends on {dep}"));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn no_file_is_over_a_thousand_lines() {
    let mut long = Vec::new();
    for dir in CRATES.iter().chain(&["bench", "tests"]) {
        for file in sources(&root().join(dir)) {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            if lines > 1000 {
                long.push(format!("{}: {lines} lines", file.display()));
            }
        }
    }
    assert!(long.is_empty(), "{long:#?}");
}

/// A source file as the module it is: its path inside the crate (`["api", "blobs"]`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_owned());
    }
    parts
}

/// The file that holds module `path` of the crate at `src`, if `path` names a module with a file.
fn file_of(src: &Path, path: &[String], roots: &[PathBuf]) -> Option<PathBuf> {
    if path.is_empty() {
        return roots.iter().find(|r| r.exists()).cloned();
    }
    let joined: PathBuf = path.iter().collect();
    [
        src.join(&joined).with_extension("rs"),
        src.join(&joined).join("mod.rs"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// The text of a file without its comments (whole lines, and what follows ` //`), its re-exports
/// and its `#[cfg(test)]` modules (which import their parent by nature). String literals stay.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut skip_depth: Option<usize> = None;
    let mut depth = 0usize;
    let mut pending_test = false;
    let mut reexport = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            continue;
        }
        // A re-export (`pub use child::Thing`) is a module's facade, not a use of the child.
        if trimmed.starts_with("pub use ") || trimmed.starts_with("pub(crate) use ") {
            reexport = !trimmed.ends_with(';');
            continue;
        }
        if reexport {
            reexport = !trimmed.ends_with(';');
            continue;
        }
        if skip_depth.is_none() && trimmed.starts_with("#[cfg(test)]") {
            pending_test = true;
            continue;
        }
        if pending_test && trimmed.starts_with("mod ") && trimmed.ends_with('{') {
            skip_depth = Some(depth);
        }
        pending_test = false;
        let opens = line.matches('{').count();
        let closes = line.matches('}').count();
        depth = (depth + opens).saturating_sub(closes);
        if let Some(d) = skip_depth {
            if depth <= d && closes > 0 {
                skip_depth = None;
            }
            continue;
        }
        out.push_str(line.split(" //").next().unwrap_or(""));
        out.push('\n');
    }
    out
}

/// The module paths a piece of code names: every `use` tree expanded, and `crate::`/`super::`/
/// `self::` paths written inline. Relative to the crate root.
fn paths_named(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let children = child_modules(code);
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if !code.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let rest = &code[i..];
        // A path from the crate root, the parent, this module, or one of this module's children
        // (named bare: `api::dispatch` in the file that declares `mod api`).
        let child = children
            .iter()
            .find(|c| rest.starts_with(c.as_str()) && rest[c.len()..].starts_with("::"));
        let starts = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|p| rest.starts_with(p))
            .or(child.map(|_| "self::"));
        let boundary = i == 0 || !ident(bytes[i - 1]) && bytes[i - 1] != b':';
        let Some(prefix) = starts.filter(|_| boundary) else {
            i += 1;
            continue;
        };
        // Read the path and, for a use tree, its braces.
        let mut end = i;
        let mut braces = 0i32;
        while end < bytes.len() {
            let b = bytes[end];
            if b == b'{' {
                braces += 1;
            } else if b == b'}' {
                if braces == 0 {
                    break;
                }
                braces -= 1;
            } else if !(ident(b)
                || b == b':'
                || (braces > 0 && (b == b',' || b.is_ascii_whitespace() || b == b'*')))
            {
                break;
            }
            end += 1;
        }
        let text: String = code[i..end].split_whitespace().collect();
        for path in expand(&text) {
            let mut parts: Vec<String> = path.split("::").map(str::to_owned).collect();
            let mut base: Vec<String> = match prefix {
                "crate::" => Vec::new(),
                "self::" => module.to_vec(),
                _ => module[..module.len().saturating_sub(1)].to_vec(),
            };
            if prefix != "self::" || path.starts_with("self::") {
                parts.remove(0);
            }
            // `super::super::x`
            while parts.first().is_some_and(|p| p == "super") {
                parts.remove(0);
                base.pop();
            }
            base.extend(parts.into_iter().filter(|p| !p.is_empty() && p != "*"));
            out.push(base);
        }
        i = end.max(i + 1);
    }
    out
}

/// The modules a file declares (`mod x;`, `pub(crate) mod x;`), whose files it may name bare.
fn child_modules(code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("mod ").or_else(|| {
                let (_, after) = l.split_once(" mod ")?;
                l.starts_with("pub").then_some(after)
            })?;
            let name = rest.strip_suffix(';')?;
            name.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
                .then(|| name.to_owned())
        })
        .collect()
}

/// `a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        return vec![tree.trim_end_matches("::").to_owned()];
    };
    let head = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .flat_map(|item| {
            let item = if item == "self" { "" } else { item };
            expand(&format!("{head}{item}"))
        })
        .collect()
}

/// File → the files it takes names from, within one crate.
fn import_graph(krate_src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let roots = [krate_src.join("lib.rs"), krate_src.join("main.rs")];
    let mut graph = BTreeMap::new();
    for file in sources(krate_src) {
        let module = module_of(krate_src, &file);
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        let mut targets = BTreeSet::new();
        for path in paths_named(&code, &module) {
            // The longest prefix of the path that is a module with a file.
            let target = (0..=path.len())
                .rev()
                .find_map(|n| file_of(krate_src, &path[..n], &roots));
            if let Some(t) = target.filter(|t| *t != file) {
                targets.insert(t);
            }
        }
        graph.insert(file, targets);
    }
    graph
}

/// The circles of the graph: each set of two or more files that all reach one another.
fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<BTreeSet<PathBuf>> {
    let reach = |from: &PathBuf| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for next in graph.get(&n).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&PathBuf, BTreeSet<PathBuf>> =
        graph.keys().map(|k| (k, reach(k))).collect();
    let mut found: Vec<BTreeSet<PathBuf>> = Vec::new();
    for (node, from_node) in &reaches {
        if found.iter().any(|c| c.contains(*node)) {
            continue;
        }
        let circle: BTreeSet<PathBuf> = from_node
            .iter()
            .filter(|other| reaches.get(other).is_some_and(|r| r.contains(*node)))
            .cloned()
            .collect();
        if circle.len() > 1 {
            found.push(circle);
        }
    }
    found
}

/// No file imports, through any chain of imports, a file that imports it: every crate and the
/// benchmark read from the top down.
#[test]
fn no_circle_of_files_in_any_crate() {
    let mut found = Vec::new();
    for dir in CRATES.iter().chain(&["bench"]) {
        let graph = import_graph(&root().join(dir).join("src"));
        for c in circles(&graph) {
            let names: BTreeSet<String> = c
                .iter()
                .map(|p| {
                    let p = p.strip_prefix(root()).unwrap_or(p);
                    p.display().to_string()
                })
                .collect();
            found.push(names);
        }
    }
    assert!(
        found.is_empty(),
        "circles of files that import one another: {found:#?}"
    );
}

/// The registry's floors (ARCHITECTURE.md): below the routers (the service floor, the work it
/// runs, storage) nothing knows HTTP, imports a router or the routers' `AppState`; storage also
/// knows neither the service nor the client crate; what the routers share knows no router; the API
/// and the cache tier are siblings that never import each other; the cache tier, which opens
/// no store, reaches for neither a store nor the service; the handlers behind a router's entry
/// take the service, not the whole `AppState`; and only the service floor holds the whole
/// metadata store.
#[test]
fn the_registry_imports_only_downwards() {
    let src = root().join("registry/src");
    let graph = import_graph(&src);
    let rel = |p: &Path| p.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
    let routers = ["api/", "cache/", "ui/", "v2.rs", "lib.rs"];
    // What a router may ask for and nothing below may: the handlers' state, HTTP's pieces, the
    // Distribution API's error envelope.
    let http_side = ["state.rs", "http.rs", "front.rs", "listener.rs", "error.rs"];
    let below = ["service/", "storage/", "seal.rs", "sync/", "jobs.rs"];
    let mut broken = Vec::new();
    for (file, targets) in &graph {
        let from = rel(file);
        let is_below = below.iter().any(|b| from.starts_with(b));
        for target in targets {
            let to = rel(target);
            let into_router = routers.iter().any(|r| to.starts_with(r));
            let wrong = (is_below && (into_router || http_side.contains(&to.as_str())))
                || (from.starts_with("storage/")
                    && !to.starts_with("storage/")
                    && below.iter().any(|b| to.starts_with(b)))
                || (http_side.contains(&from.as_str()) && into_router)
                || (from.starts_with("cache/") && to.starts_with("service/"))
                || (from.starts_with("api/") && to.starts_with("cache/"))
                || (from.starts_with("cache/") && to.starts_with("api/"));
            if wrong {
                broken.push(format!("{from} imports {to}"));
            }
        }
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        if is_below && code.contains("axum") {
            broken.push(format!("{from} knows HTTP (axum)"));
        }
        if is_below && code.contains("AppState") {
            broken.push(format!("{from} takes the routers' AppState"));
        }
        let stores = ["AppState", "MetadataStore", "BlobStore", "Service"];
        if from.starts_with("cache/") && stores.iter().any(|s| code.contains(s)) {
            broken.push(format!("{from} reaches for a store: a cache opens none"));
        }
        // A router's entry (its mod.rs, and the UI's sign-in, which is the entrance's) takes the
        // router's state apart; the handlers behind it are handed the service and what else they
        // use, never the whole state.
        let entries = ["api/mod.rs", "ui/mod.rs", "ui/session.rs"];
        let is_handler = from.starts_with("api/") || from.starts_with("ui/");
        if is_handler && !entries.contains(&from.as_str()) && code.contains("AppState") {
            broken.push(format!(
                "{from} is a handler that takes the router's whole AppState"
            ));
        }
        // The whole metadata store is held by the service floor and opened by the wiring; everyone
        // else takes one of its facades (`Service::manifests`, `Service::tags`, …).
        let holds_the_store = ["storage/", "service/", "lib.rs"];
        if !holds_the_store.iter().any(|h| from.starts_with(h)) && code.contains("MetadataStore") {
            broken.push(format!(
                "{from} names the whole metadata store, not a facade of it"
            ));
        }
        if from.starts_with("storage/") && code.contains("vial_client") {
            broken.push(format!("{from} imports the client crate"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// A write that is one step of a protocol over both stores (storing bytes, or the rows that name
/// them) is made only in the service floor, where the protocol's order is written once; storage
/// implements those writes and garbage collection (in the service floor too) removes. Everything
/// else calls the service.
#[test]
fn only_the_service_floor_writes_both_stores() {
    let src = root().join("registry/src");
    let mut broken = Vec::new();
    for file in sources(&src) {
        let from = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if from.starts_with("service/") || from.starts_with("storage/") {
            continue;
        }
        for step in store_writes(&code_of(&std::fs::read_to_string(&file).unwrap())) {
            broken.push(format!("{from} calls {step}…) on a store itself"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// The facades of the metadata store that `Service` hands out (service/mod.rs).
const FACADES: [&str; 7] = [
    ".manifests()",
    ".tags()",
    ".blob_rows()",
    ".upload_rows()",
    ".job_rows()",
    ".leases()",
    ".seal_cache()",
];

/// The steps of two-store protocols that `code` takes on a store itself (`….blobs.put_pack(`).
fn store_writes(code: &str) -> Vec<&'static str> {
    // Appending to an upload and touching its row are single calls whose order does not matter
    // (ARCHITECTURE.md), so they are not here.
    const STEPS: [&str; 17] = [
        ".put(",
        ".put_streamed(",
        ".put_pack(",
        ".delete(",
        ".delete_pack(",
        ".create_upload(",
        ".commit_upload(",
        ".abort_upload(",
        ".commit_blob(",
        ".begin_pack(",
        ".commit_pack(",
        ".drop_pack(",
        ".delete_upload(",
        ".collect_blobs(",
        ".collect_packs(",
        ".commit_compaction(",
        ".purge_manifests(",
    ];
    // Method calls split over lines (`state\n.blobs\n.put(`) read as one.
    let code: String = code.split_whitespace().collect();
    STEPS
        .into_iter()
        .filter(|step| {
            code.match_indices(step).any(|(at, _)| {
                // The cache tier's own store is not one of the registry's two.
                let before = &code[..at];
                before.ends_with("blobs")
                    || before.ends_with("meta")
                    || FACADES.iter().any(|f| before.ends_with(f))
            })
        })
        .collect()
}

/// Outside the registry's cache tier (a proxy, which checks each chunk as it keeps it), chunks
/// are read in bulk only through the client's run reader, which hands out no byte unverified:
/// no program reads raw bulk bytes and splits them into chunks itself.
#[test]
fn chunks_are_read_in_runs_only() {
    const READER: &str = "client/src/registry/runs.rs";
    let mut broken = Vec::new();
    for krate in [
        "client",
        "snapshotter",
        "cli",
        "oras-compat",
        "conformance",
        "bench",
    ] {
        for file in sources(&root().join(krate)) {
            let from = file
                .strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let code: String = code_of(&std::fs::read_to_string(&file).unwrap())
                .split_whitespace()
                .collect();
            if from != READER && code.contains(".read_chunks(") {
                broken.push(format!("{from} reads chunks in bulk itself"));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
    let reader = std::fs::read_to_string(root().join(READER)).unwrap();
    assert!(
        reader.contains(".read_chunks("),
        "the run reader no longer reads in bulk"
    );
}

/// The checker itself: a circle it is shown is a circle it finds, and use trees expand.
#[test]
fn the_checker_sees_use_trees_and_circles() {
    assert_eq!(
        expand("crate::{a::{B, c}, d::*, self}"),
        ["crate::a::B", "crate::a::c", "crate::d::*", "crate"]
    );
    let m = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        paths_named(
            "use super::{x::Y, z};\nlet q = crate::w::f();",
            &m(&["a", "b"])
        ),
        [m(&["a", "x", "Y"]), m(&["a", "z"]), m(&["w", "f"])]
    );
    let p = |s: &str| PathBuf::from(s);
    let mut graph = BTreeMap::new();
    graph.insert(p("a"), BTreeSet::from([p("b")]));
    graph.insert(p("b"), BTreeSet::from([p("c")]));
    graph.insert(p("c"), BTreeSet::from([p("a")]));
    graph.insert(p("d"), BTreeSet::from([p("a")]));
    assert_eq!(circles(&graph), [BTreeSet::from([p("a"), p("b"), p("c")])]);
    graph.insert(p("c"), BTreeSet::new());
    assert!(circles(&graph).is_empty());
    let code =
        code_of("use crate::a;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\nfn f() {}\n");
    assert!(code.contains("crate::a") && !code.contains("super") && code.contains("fn f"));
    let protocol =
        "state\n        .blobs\n        .put_pack(&id, body).await?;\nstate.meta.drop_pack(&id)";
    assert_eq!(store_writes(protocol), [".put_pack(", ".drop_pack("]);
    assert!(store_writes("state.put_blob(repo, digest, bytes); cache.put(digest)").is_empty());
    let facade = "run.service\n    .blob_rows()\n    .commit_blob(repo, d, 3, &check)";
    assert_eq!(store_writes(facade), [".commit_blob("]);
    assert!(!code.contains("kid"), "a re-export is not a use");
}
