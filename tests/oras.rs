//! The ORAS Python SDK pushes and pulls files and directories through vial.

use std::path::Path;
use std::process::Command;

use crate::support::{oci::pseudo_random, oras_python, run, Server};

const SCRIPT: &str = r#"
import sys, oras.client
mode, host, target, workdir, outdir = sys.argv[1:6]
client = oras.client.OrasClient(hostname=host, insecure=True)
import os
os.chdir(workdir)
if mode == "files":
    files = sorted(f for f in os.listdir(".") if os.path.isfile(f))
    client.push(target=target, files=files)
else:
    client.push(target=target, files=["model"])
print(client.get_tags(target.rsplit(":", 1)[0]))
client.pull(target=target, outdir=outdir)
"#;

fn write_tree(dir: &Path) {
    std::fs::create_dir_all(dir.join("model/nested")).unwrap();
    std::fs::write(dir.join("config.json"), br#"{"hidden_size": 64}"#).unwrap();
    std::fs::write(dir.join("model.safetensors"), pseudo_random(3 << 20, 11)).unwrap();
    std::fs::write(dir.join("empty.txt"), b"").unwrap();
    std::fs::write(dir.join("model/weights.bin"), pseudo_random(1 << 20, 12)).unwrap();
    std::fs::write(dir.join("model/nested/tokenizer.json"), b"{\"vocab\": {}}").unwrap();
}

#[test]
fn oras_sdk_pushes_and_pulls_files_one_layer_each() {
    let Some(python) = oras_python() else { return };
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    write_tree(work.path());
    let out = work.path().join("out");
    run(Command::new(&python)
        .args(["-c", SCRIPT, "files", &server.addr])
        .arg(format!("{}/oras/files:v1", server.addr))
        .arg(work.path())
        .arg(&out));
    for name in ["config.json", "model.safetensors", "empty.txt"] {
        assert_eq!(
            std::fs::read(out.join(name)).unwrap(),
            std::fs::read(work.path().join(name)).unwrap(),
            "{name} differs after an ORAS round trip"
        );
    }
}

#[test]
fn oras_sdk_pushes_and_pulls_a_directory_as_one_archive() {
    let Some(python) = oras_python() else { return };
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    write_tree(work.path());
    let out = work.path().join("out");
    run(Command::new(&python)
        .args(["-c", SCRIPT, "dir", &server.addr])
        .arg(format!("{}/oras/dir:v1", server.addr))
        .arg(work.path())
        .arg(&out));
    for name in ["model/weights.bin", "model/nested/tokenizer.json"] {
        assert_eq!(
            std::fs::read(out.join(name)).unwrap(),
            std::fs::read(work.path().join(name)).unwrap(),
            "{name} differs after an ORAS directory round trip"
        );
    }
}
