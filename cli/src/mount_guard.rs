//! The guard beside a `vial mount` process: it detaches the mount if the process dies and
//! fusermount3 leaves the mount behind.
//!
//! A mount asks fusermount3 to unmount it if its process dies (fuser's `AutoUnmount`).
//! fusermount3 keeps a helper waiting on a socket to the mount process. When the socket closes, the
//! helper opens the mountpoint, and unmounts only if that open fails with ENOTCONN. A killed
//! process closes its descriptors one by one, and the socket can close before the FUSE device. The
//! helper's open then waits on a connection that is being torn down and fails with ECONNABORTED
//! instead. The helper exits, and every later access to the mountpoint says "transport endpoint is
//! not connected". Under CPU load here that happened in 5 of 40 kills (libfuse 3.14).
//!
//! So `vial mount` starts this guard as a small process of its own (`vial mount-guard`). The
//! guard's stdin is a pipe whose other end only the mount process holds. When the pipe closes,
//! the mount process has ended. If it unmounted cleanly, or fusermount3's helper did its job, the
//! mountpoint opens again and the guard exits. If the dead mount is still there after a grace
//! period, the guard detaches it the way `vial umount --lazy` does.

use std::io::{ErrorKind, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

/// How long the guard leaves a dead mount to fusermount3's helper. The helper acts within
/// milliseconds when it acts at all; waiting keeps the two from unmounting one after the other.
const GRACE: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Args)]
pub struct GuardArgs {
    /// The mountpoint to watch.
    mountpoint: PathBuf,
    /// The device number of the mount (st_dev of its root), so a directory that is no longer
    /// that mount is never unmounted.
    #[arg(long)]
    dev: u64,
}

/// The mount process's side of a guard: the write end of the guard's stdin.
pub struct Guard {
    child: Child,
    alive: Option<ChildStdin>,
}

impl Guard {
    /// Starts the guard of the mount at `mountpoint`, which must be mounted and served. Without a
    /// guard the mount still works, so a failure is logged rather than returned.
    pub fn start(mountpoint: &Path) -> Option<Guard> {
        let started = (|| -> std::io::Result<Guard> {
            let dev = std::fs::metadata(mountpoint)?.dev();
            let mut cmd = Command::new(std::env::current_exe()?);
            cmd.arg("mount-guard")
                .arg(mountpoint)
                .arg("--dev")
                .arg(dev.to_string())
                .current_dir("/")
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            // Out of the terminal's process group: a Ctrl-C is for the mount process, which
            // unmounts cleanly, and the guard must outlive it.
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
            let mut child = cmd.spawn()?;
            let alive = child.stdin.take();
            Ok(Guard { child, alive })
        })();
        match started {
            Ok(guard) => Some(guard),
            Err(e) => {
                tracing::warn!(mountpoint = %mountpoint.display(), error = %e,
                    "cannot start the mount's guard; a crash may leave the mount behind");
                None
            }
        }
    }

    /// After the mount has ended cleanly: lets the guard go and waits for it to exit (it finds
    /// the mountpoint clear at once).
    pub fn release(mut self) {
        drop(self.alive.take());
        let _ = self.child.wait();
    }
}

/// What a probe of the mountpoint found.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// The mount is still there and its process is gone.
    Dead,
    /// The directory opens (unmounted, or served by a live process) or is no longer that mount.
    Clear,
}

fn probe(mountpoint: &Path, dev: u64) -> Found {
    match std::fs::File::open(mountpoint) {
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::NotConnected | ErrorKind::ConnectionAborted
            ) =>
        {
            // A stat can still answer from cached attributes, and does say whose directory it is.
            match std::fs::symlink_metadata(mountpoint) {
                Ok(m) if m.dev() != dev => Found::Clear,
                _ => Found::Dead,
            }
        }
        _ => Found::Clear,
    }
}

/// `vial mount-guard`: waits for the mount process to end, then detaches its mount if it is dead.
pub fn run(args: GuardArgs) -> anyhow::Result<()> {
    // Reads until the mount process's end of stdin closes, which it does when the process ends.
    let mut stdin = std::io::stdin().lock();
    let mut sink = [0u8; 64];
    loop {
        match stdin.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let ended = Instant::now();
    loop {
        if probe(&args.mountpoint, args.dev) == Found::Clear {
            return Ok(());
        }
        if ended.elapsed() >= GRACE {
            break;
        }
        std::thread::sleep(POLL);
    }
    tracing::warn!(mountpoint = %args.mountpoint.display(),
        "the mount process died and left its mount behind; detaching it");
    vial_snapshotter::mount::unmount_path(&args.mountpoint, true).map_err(|e| {
        anyhow::anyhow!(
            "cannot detach the dead mount at {}: {e}",
            args.mountpoint.display()
        )
    })
}
