//! The block of containerd's configuration that plugs `vial snapshotter` in, written once: `vial
//! snapshotter --print-containerd-config` prints it for the flags it was given, docs/containerd.md
//! shows it, the Kubernetes manifests install it, and the containerd tests run containerd with it.

use std::fmt::Write as _;
use std::path::Path;

/// What containerd's configuration (version 2 or 3) needs for a snapshotter listening on `address`
/// with its snapshots under `root`: the `[proxy_plugins.vial]` block, and the transfer service's
/// unpack configuration.
///
/// The proxy plugin's exports are what other parts of a node read of the plugin:
/// - `root`: the filesystem the CRI reports as vial's image filesystem (`ImageFsInfo`), which
///   kubelet's eviction manager and image garbage collection stat; without it containerd names
///   `<containerd root>/io.containerd.snapshotter.v1.vial`, which does not exist.
/// - `enable_remote_snapshot_annotations`: containerd's transfer service (nerdctl, `ctr images
///   pull` on 2.x) hands the snapshotter the labels that say a layer is a vial volume's.
///
/// containerd 1.x reads `type` and `address` and ignores the exports.
///
/// containerd 2.x pulls for `ctr images pull` and nerdctl through its transfer service, which
/// unpacks only with the snapshotters its `unpack_config` lists ("no unpack platforms defined"
/// otherwise). The list replaces containerd's default, so overlayfs is listed beside vial.
/// containerd 1.6 has no transfer service and ignores it.
pub fn containerd_block(address: &Path, root: &Path) -> String {
    let mut block = String::new();
    let _ = writeln!(block, "[proxy_plugins]");
    let _ = writeln!(block, "  [proxy_plugins.vial]");
    let _ = writeln!(block, "    type = \"snapshot\"");
    let _ = writeln!(block, "    address = {}", toml_string(address));
    let _ = writeln!(block, "    [proxy_plugins.vial.exports]");
    let _ = writeln!(block, "      root = {}", toml_string(root));
    let _ = writeln!(block, "      enable_remote_snapshot_annotations = \"true\"");
    for snapshotter in ["vial", "overlayfs"] {
        let _ = writeln!(block, "{UNPACK_CONFIG}");
        let _ = writeln!(block, "  platform = \"linux\"");
        let _ = writeln!(block, "  snapshotter = \"{snapshotter}\"");
    }
    block
}

const UNPACK_CONFIG: &str = "[[plugins.\"io.containerd.transfer.v1.local\".unpack_config]]";

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
    fn the_block_names_the_socket_exports_the_root_and_unpacks_transfers_with_vial() {
        let block = containerd_block(
            Path::new("/run/vial/snapshotter.sock"),
            Path::new("/var/lib/vial/snap\"shots"),
        );
        assert_eq!(
            block,
            "[proxy_plugins]\n  [proxy_plugins.vial]\n    type = \"snapshot\"\n    \
             address = \"/run/vial/snapshotter.sock\"\n    [proxy_plugins.vial.exports]\n      \
             root = \"/var/lib/vial/snap\\\"shots\"\n      \
             enable_remote_snapshot_annotations = \"true\"\n\
             [[plugins.\"io.containerd.transfer.v1.local\".unpack_config]]\n  \
             platform = \"linux\"\n  snapshotter = \"vial\"\n\
             [[plugins.\"io.containerd.transfer.v1.local\".unpack_config]]\n  \
             platform = \"linux\"\n  snapshotter = \"overlayfs\"\n"
        );
    }
}
