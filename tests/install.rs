//! `scripts/install`: what a user puts on their PATH is small, and keeps its line tables beside it.

use std::process::Command;

use crate::support::vial_bin;

#[test]
fn the_installed_binary_is_small_and_names_its_line_tables_beside_it() {
    let prefix = tempfile::tempdir().unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install");
    let out = Command::new(&script)
        .arg("--binary")
        .arg(vial_bin())
        .arg(prefix.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/install failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = prefix.path().join("bin");
    let built = std::fs::metadata(vial_bin()).unwrap().len();
    let installed = std::fs::metadata(bin.join("vial")).unwrap().len();
    let tables = std::fs::metadata(bin.join("vial.debug")).unwrap().len();
    // The build under test has its line tables (the release profile keeps them); the installed
    // binary has them only in vial.debug.
    assert!(
        installed < built / 2 && tables > installed / 2,
        "built {built} bytes, installed {installed}, vial.debug {tables}"
    );
    let version = Command::new(bin.join("vial"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success());
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("vial "));
    // The link a backtrace follows to find files and lines.
    let link = Command::new("readelf")
        .args(["--string-dump=.gnu_debuglink"])
        .arg(bin.join("vial"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&link.stdout).contains("vial.debug"),
        "{}",
        String::from_utf8_lossy(&link.stdout)
    );
}
