//! The block of containerd's configuration that plugs `vial snapshotter` in, written once: `vial
//! snapshotter --print-containerd-config` prints it for the flags it was given, docs/containerd.md
//! shows it, and the CRI tests run containerd with it.

use std::fmt::Write as _;
use std::path::Path;

/// The `[proxy_plugins.vial]` block for a snapshotter listening on `address` with its snapshots
/// under `root`, for containerd 2.x (a configuration of version 2 or 3). Its exports are what
/// other parts of a node read of the plugin:
/// - `root`: the filesystem the CRI reports as vial's image filesystem (`ImageFsInfo`), which
///   kubelet's eviction manager and image garbage collection stat; without it containerd names
///   `<containerd root>/io.containerd.snapshotter.v1.vial`, which does not exist.
/// - `enable_remote_snapshot_annotations`: containerd's transfer service (nerdctl, `ctr images
///   pull` on 2.x) hands the snapshotter the labels that say a layer is a vial volume's.
///
/// containerd 1.x reads `type` and `address` and ignores the exports.
pub fn proxy_plugin_block(address: &Path, root: &Path) -> String {
    let mut block = String::new();
    let _ = writeln!(block, "[proxy_plugins]");
    let _ = writeln!(block, "  [proxy_plugins.vial]");
    let _ = writeln!(block, "    type = \"snapshot\"");
    let _ = writeln!(block, "    address = {}", toml_string(address));
    let _ = writeln!(block, "    [proxy_plugins.vial.exports]");
    let _ = writeln!(block, "      root = {}", toml_string(root));
    let _ = writeln!(block, "      enable_remote_snapshot_annotations = \"true\"");
    block
}

/// A TOML basic string holding `path`.
fn toml_string(path: &Path) -> String {
    let mut out = String::from("\"");
    for c in path.to_string_lossy().chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_names_the_socket_and_exports_the_root() {
        let block = proxy_plugin_block(
            Path::new("/run/vial/snapshotter.sock"),
            Path::new("/var/lib/vial/snap\"shots"),
        );
        assert_eq!(
            block,
            "[proxy_plugins]\n  [proxy_plugins.vial]\n    type = \"snapshot\"\n    \
             address = \"/run/vial/snapshotter.sock\"\n    [proxy_plugins.vial.exports]\n      \
             root = \"/var/lib/vial/snap\\\"shots\"\n      \
             enable_remote_snapshot_annotations = \"true\"\n"
        );
    }
}
