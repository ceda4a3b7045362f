//! The `tree` benchmark: directories of any shape (#48). Volumes of many small files (10,000 and
//! 100,000 of 4 KiB, 100 to a directory) and a mixed one (1,000 small files beside two 1 GiB
//! shards), pushed, pulled and read whole with vial, against the same directory shipped as one
//! tarball layer and as one layer per file, every client with the open-file limit at 1024, on a
//! registry on disk and on PostgreSQL + S3. See bench/README.md.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::files::{manifest, Backends, Layer, Registry};
use crate::mounted::{drop_page_cache, files_under, read_files, MountSpec, Mounted};
use crate::run::machine;
use crate::servers::{self, proc_status_kib, WorkDir};

mod measure;
mod report;
mod results;
mod volume;
use measure::{limited, log_says_emfile, Run, Target, Watch};
use results::{
    Results, Row, VolumeRun, LS, LS_OP, MOUNT, MOUNT_OP, PER_FILE, PULL, PULL_READ, PUSH, READ,
    TARBALL, VIAL,
};
use volume::Volume;

#[derive(Debug, Args)]
pub struct TreeArgs {
    /// The `vial` binary: registry, push, pull and mount.
    #[arg(long)]
    pub vial: PathBuf,
    /// Volumes: `10k` and `100k` (that many files of 4 KiB) and `mixed` (1,000 of them beside
    /// two 1 GiB shards). Default all three; with --quick `10k,mixed`.
    #[arg(long, value_delimiter = ',')]
    pub volumes: Vec<String>,
    /// Registry backends: `disk` (SQLite + files) and `s3` (PostgreSQL + s3s-fs). Default both;
    /// with --quick `disk`.
    #[arg(long, value_delimiter = ',')]
    pub backends: Vec<String>,
    /// The S3-compatible server for the `s3` backend (scripts/test-all builds it).
    #[arg(long, default_value = ".ci/tools/bin/s3s-fs")]
    pub s3s_fs: PathBuf,
    /// PostgreSQL's server binaries (initdb, pg_ctl) for the `s3` backend.
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pub pg_bin: PathBuf,
    /// Where volumes, registries and logs go (a fresh directory under it, removed at the end).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Also write every row and goal as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The 10,000-file volume and a mixed one with 64 MiB shards, on disk only: a smoke run.
    #[arg(long)]
    pub quick: bool,
    /// Leave the machine's free page reporting on (see `files`, bench/src/hostmem.rs).
    #[arg(long)]
    pub keep_page_reporting: bool,
}

/// The tag every client pushes.
const TAG: &str = "v1";

/// What every volume and backend is measured with.
struct Ctx<'a> {
    args: &'a TreeArgs,
    /// vial-bench itself, for the file-per-layer client.
    bench: &'a Path,
    /// A script that runs `vial` with the open-file limit lowered, for [`Mounted`] (the mount
    /// process it starts inherits the limit).
    limited_vial: &'a Path,
    work: &'a Path,
}

/// A row measured cold (page cache dropped first), its failure kept as its note.
fn measure(
    op: &'static str,
    client: &'static str,
    vial: bool,
    f: impl FnOnce() -> Result<Run>,
) -> Row {
    let mut row = Row::new(op, client, vial);
    eprintln!("vial-bench: {op}: {client}");
    match drop_page_cache().and_then(|()| f()) {
        Ok(run) => row.fill(run),
        Err(e) => {
            eprintln!("vial-bench: {op} with {client} failed: {e:#}");
            row.note = Some(format!("failed: {e:#}"));
        }
    }
    row
}

/// Files and bytes under `dir`, to check what a pull or a read delivered.
fn tree_size(dir: &Path) -> Result<(usize, u64)> {
    let files = files_under(dir)?;
    let mut bytes = 0;
    for f in &files {
        bytes += f.metadata()?.len();
    }
    Ok((files.len(), bytes))
}

/// Notes on `row` if `dir` does not hold what the volume holds.
fn check(row: &mut Row, dir: &Path, want: (usize, u64)) {
    if row.seconds.is_none() {
        return;
    }
    match tree_size(dir) {
        Ok(got) if got == want => {}
        Ok((files, bytes)) => {
            row.note = Some(format!(
                "wrong result: {files} files, {bytes} bytes (want {}, {})",
                want.0, want.1
            ));
        }
        Err(e) => row.note = Some(format!("could not check the result: {e:#}")),
    }
}

/// An empty directory at `path`, whatever was there.
fn fresh(path: &Path) -> Result<PathBuf> {
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir_all(path)?;
    Ok(path.to_path_buf())
}

fn s(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// Everything one volume is measured by on one registry.
struct Bench<'a> {
    ctx: &'a Ctx<'a>,
    src: &'a Path,
    want: (usize, u64),
    dir: PathBuf,
    logs: PathBuf,
    host: String,
}

impl Bench<'_> {
    fn log(&self, name: &str) -> PathBuf {
        self.logs.join(format!("{name}.log"))
    }

    /// `vial ARGS` with a HOME (and cache) of its own: no local index or cache helps it.
    fn vial(&self, args: &[String], name: &str) -> Result<Run> {
        let home = fresh(&self.dir.join(format!("home-{name}")))?;
        let env = [
            ("HOME", s(home.display())),
            ("XDG_CACHE_HOME", s(home.join("cache").display())),
        ];
        limited(&self.ctx.args.vial, args, &env, &self.log(name))
    }

    /// `vial-bench files-client ACTION --base … --repo REPO ARGS`.
    fn files_client(&self, action: &str, repo: &str, args: &[String], name: &str) -> Result<Run> {
        let mut all = vec![
            s("files-client"),
            s(action),
            s("--base"),
            format!("http://{}", self.host),
            s("--repo"),
            s(repo),
        ];
        all.extend_from_slice(args);
        limited(self.ctx.bench, &all, &[], &self.log(name))
    }

    /// vial and the tarball push the volume, each into its own repository; the tarball's push
    /// includes making the tarball.
    fn pushes(&self) -> Result<Vec<Row>> {
        let src = s(self.src.display());
        let tar = fresh(&self.dir.join("tarball"))?.join("tree.tar");
        let rows = vec![
            measure(PUSH, VIAL, true, || {
                let reference = format!("{}/tree/vial", self.host);
                self.vial(
                    &[s("push"), src.clone(), reference, s("--tag"), s(TAG)],
                    "vial-push",
                )
            }),
            measure(PUSH, TARBALL, false, || {
                let tar_args = [s("-cf"), s(tar.display()), s("-C"), src.clone(), s(".")];
                let created = limited(Path::new("tar"), &tar_args, &[], &self.log("tar-create"))?;
                let push = [
                    s("--hash"),
                    s("--file"),
                    s(tar.display()),
                    s("--tag"),
                    s(TAG),
                ];
                Ok(created.then(self.files_client(PUSH, "tree/tarball", &push, "tarball-push")?))
            }),
        ];
        let _ = std::fs::remove_dir_all(self.dir.join("tarball"));
        Ok(rows)
    }

    /// The layer-per-file client's push and pull, skipped where its manifest would not fit or
    /// its push fails ("where it copes"), and measured after every vial row: its uploads
    /// store each small file whole, which moves the chunks of the same bytes out of the packs
    /// `vial push` put them in (the registry keeps one copy of a blob, where it was last
    /// stored), so vial's rows would measure reads of the other client's layout.
    fn per_file(&self, refused: Option<String>) -> Result<(Row, Row)> {
        let src = s(self.src.display());
        let push = match refused {
            Some(why) => Row::new(PUSH, PER_FILE, false).skipped(&why),
            None => {
                let row = measure(PUSH, PER_FILE, false, || {
                    let push = [s("--dir"), src.clone(), s("--tag"), s(TAG)];
                    self.files_client(PUSH, "tree/per-file", &push, "per-file-push")
                });
                match row.note.clone() {
                    Some(why) if row.seconds.is_none() => row.skipped(&why),
                    _ => row,
                }
            }
        };
        if push.seconds.is_none() {
            return Ok((push, Row::new(PULL, PER_FILE, false).skipped("not pushed")));
        }
        let out = fresh(&self.dir.join("out"))?;
        let mut pull = measure(PULL, PER_FILE, false, || {
            let pull = [s("--tag"), s(TAG), s("--out"), s(out.display())];
            self.files_client(PULL, "tree/per-file", &pull, "per-file-pull")
        });
        check(&mut pull, &out, self.want);
        std::fs::remove_dir_all(&out)?;
        Ok((push, pull))
    }

    /// vial and the tarball pull their repositories into an empty directory, checked against the
    /// volume afterwards; the tarball's pull is the blob fetched, then `tar -xf`. Each output is
    /// emptied before the page cache is dropped, so no client's timing pays for removing the
    /// last one's files.
    fn pulls(&self) -> Result<Vec<Row>> {
        let out = fresh(&self.dir.join("out"))?;
        let tarball = self.dir.join("tarball");
        let mut vial = measure(PULL, VIAL, true, || {
            let reference = format!("{}/tree/vial:{TAG}", self.host);
            self.vial(&[s("pull"), reference, s(out.display())], "vial-pull")
        });
        check(&mut vial, &out, self.want);
        fresh(&out)?;
        fresh(&tarball)?;
        let mut tar = measure(PULL, TARBALL, false, || {
            let pull = [s("--tag"), s(TAG), s("--out"), s(tarball.display())];
            let pulled = self.files_client(PULL, "tree/tarball", &pull, "tarball-pull")?;
            let extract = [
                s("-xf"),
                s(tarball.join("tree.tar").display()),
                s("-C"),
                s(out.display()),
            ];
            Ok(pulled.then(limited(
                Path::new("tar"),
                &extract,
                &[],
                &self.log("tar-extract"),
            )?))
        });
        check(&mut tar, &out, self.want);
        std::fs::remove_dir_all(&tarball)?;
        std::fs::remove_dir_all(&out)?;
        Ok(vec![vial, tar])
    }

    /// `vial mount` through the limit, on an empty cache of its own.
    fn mount(&self, name: &str) -> Result<Mounted> {
        let spec = MountSpec {
            vial: self.ctx.limited_vial.to_path_buf(),
            reference: format!("{}/tree/vial:{TAG}", self.host),
            cache_dir: fresh(&self.dir.join(format!("cache-{name}")))?,
            cache_size: "10GiB".into(),
            prefetch: "none",
            log: self.log(name),
            extra: Vec::new(),
        };
        Mounted::mount(&spec, &fresh(&self.dir.join(format!("mnt-{name}")))?)
    }

    /// Every file in tree order (sorted paths), each read whole, one at a time, as `find -exec
    /// cat` would: through a cold mount from `vial mount` to the last byte, and as `vial pull`
    /// into an empty directory followed by the same read.
    fn reads(&self) -> Result<Vec<Row>> {
        let mut mount_row = Row::new(READ, MOUNT, true);
        eprintln!("vial-bench: {READ}: {MOUNT}");
        if let Err(e) = drop_page_cache().and_then(|()| self.mount_read(&mut mount_row)) {
            mount_row.note = Some(format!("failed: {e:#}"));
        }
        let out = fresh(&self.dir.join("out"))?;
        let pull = measure(READ, PULL_READ, false, || {
            let reference = format!("{}/tree/vial:{TAG}", self.host);
            let pulled = self.vial(&[s("pull"), reference, s(out.display())], "vial-pull-read")?;
            let files = files_under(&out)?;
            let read = read_files(&files, 1)?;
            if (files.len(), read.bytes) != self.want {
                bail!(
                    "read {} files, {} bytes from the pull",
                    files.len(),
                    read.bytes
                );
            }
            Ok(Run {
                seconds: pulled.seconds + read.seconds,
                ..pulled
            })
        });
        std::fs::remove_dir_all(&out)?;
        Ok(vec![mount_row, pull])
    }

    fn mount_read(&self, row: &mut Row) -> Result<()> {
        let m = self.mount("mount-read")?;
        let pid = m.pid.context("the mount process was not found")?;
        let watch = Watch::start(Target::Pid(pid));
        let files = files_under(&m.mountpoint)?;
        let read = read_files(&files, 1)?;
        let seconds = m.started.elapsed().as_secs_f64();
        row.fds = Some(watch.stop()?);
        row.cpu = m.cpu_seconds();
        row.rss_mib = m.vmhwm_kib().map(|k| k as f64 / 1024.0);
        row.seconds = Some(seconds);
        row.emfile = log_says_emfile(&self.log("mount-read"));
        if (files.len(), read.bytes) != self.want {
            row.note = Some(format!(
                "read {} files, {} bytes through the mount",
                files.len(),
                read.bytes
            ));
        }
        m.unmount()
    }

    /// A fresh mount on an empty cache, page cache dropped: how long `vial mount` takes to
    /// return, then `ls -lR` through it. The mount row's descriptors are the mount process's
    /// during the listing.
    fn mount_and_list(&self) -> Vec<Row> {
        let mut mount_row = Row::new(MOUNT_OP, MOUNT, true);
        let mut ls_row = Row::new(LS_OP, LS, true);
        eprintln!("vial-bench: {MOUNT_OP} and {LS_OP}");
        let listed = drop_page_cache().and_then(|()| {
            let m = self.mount("mount-ls")?;
            mount_row.seconds = Some(m.seconds);
            let pid = m.pid.context("the mount process was not found")?;
            let watch = Watch::start(Target::Pid(pid));
            let ls = limited(
                Path::new("ls"),
                &[s("-lR"), s(m.mountpoint.display())],
                &[],
                &self.log("ls"),
            );
            mount_row.fds = Some(watch.stop()?);
            mount_row.rss_mib = m.vmhwm_kib().map(|k| k as f64 / 1024.0);
            mount_row.emfile = log_says_emfile(&self.log("mount-ls"));
            m.unmount()?;
            ls
        });
        match listed {
            Ok(run) => ls_row.fill(run),
            Err(e) if mount_row.seconds.is_none() => {
                mount_row.note = Some(format!("failed: {e:#}"));
                ls_row.note = Some(s("skipped: no mount"));
            }
            Err(e) => ls_row.note = Some(format!("failed: {e:#}")),
        }
        vec![mount_row, ls_row]
    }

    /// `None` if a manifest of one layer per file fits the registry, else why not, so the
    /// file-per-layer client does not upload every file first to learn it. Placeholder digests
    /// have the real ones' length, so the manifest's length is the real one's.
    fn per_file_refused(&self) -> Result<Option<String>> {
        let layers: Vec<Layer> = files_under(self.src)?
            .iter()
            .map(|p| {
                Ok(Layer {
                    digest: format!("sha256:{}", "0".repeat(64)),
                    size: p.metadata()?.len(),
                    title: s(p.strip_prefix(self.src)?.display()),
                })
            })
            .collect::<Result<_>>()?;
        let len = manifest(&layers)?.len();
        let why = refused(&self.host, "tree/per-file", len)?;
        Ok(why.map(|why| format!("its manifest of {:.1} MB: {why}", len as f64 / 1e6)))
    }
}

/// Whether the registry at `host` refuses a manifest of `len` bytes for `repo`, asked without
/// sending one: the PUT's headers with `Expect: 100-continue`, which the registry answers from
/// the length alone, 100 (send it) or 413 (too large, with its reason). A body sent whole would be
/// cut off by the 413 and its answer lost to a broken pipe.
fn refused(host: &str, repo: &str, len: usize) -> Result<Option<String>> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(host)?;
    conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(
        conn,
        "PUT /v2/{repo}/manifests/probe HTTP/1.1\r\nHost: {host}\r\n\
         Content-Type: application/vnd.oci.image.manifest.v1+json\r\n\
         Content-Length: {len}\r\nExpect: 100-continue\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // A 413 closes the connection after its body; a 100 leaves it open, waiting for ours.
    while let Ok(n @ 1..) = conn.read(&mut buf) {
        answer.extend_from_slice(&buf[..n]);
        if !answer.starts_with(b"HTTP/1.1 413") && answer.contains(&b'\n') {
            break;
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    if !answer.starts_with("HTTP/1.1 413") {
        return Ok(None);
    }
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let json: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let why = json["errors"][0]["message"].as_str().unwrap_or("413");
    Ok(Some(why.to_owned()))
}

async fn run_volume(ctx: &Ctx<'_>, vol: &Volume, src: &Path, backend: &str) -> Result<VolumeRun> {
    let want = tree_size(src)?;
    let dir = fresh(&ctx.work.join(format!("{backend}-{}", vol.name)))?;
    let logs = fresh(&dir.join("logs"))?;
    let tools = Backends {
        vial: &ctx.args.vial,
        s3s_fs: &ctx.args.s3s_fs,
        pg_bin: &ctx.args.pg_bin,
    };
    let reg = Registry::start(&tools, backend, &dir).await?;
    let b = Bench {
        ctx,
        src,
        want,
        host: reg.host()?,
        dir,
        logs,
    };
    eprintln!(
        "vial-bench: {} on {backend} (logs in {})",
        vol.describe(),
        b.logs.display()
    );
    // Failing to ask is no answer: the file-per-layer client then finds out itself.
    let refused = b.per_file_refused().unwrap_or_else(|e| {
        eprintln!("vial-bench: could not ask the registry about the manifest's size: {e:#}");
        None
    });
    let pushes = b.pushes()?;
    let pulls = b.pulls()?;
    let reads = b.reads()?;
    let listing = b.mount_and_list();
    let (per_file_push, per_file_pull) = b.per_file(refused)?;
    let mut rows = pushes;
    rows.push(per_file_push);
    rows.extend(pulls);
    rows.push(per_file_pull);
    rows.extend(reads);
    rows.extend(listing);
    let registry_rss_mib = proc_status_kib(reg.server.pid(), "VmHWM").map(|k| k as f64 / 1024.0);
    drop(reg);
    std::fs::remove_dir_all(&b.dir)?;
    Ok(VolumeRun {
        volume: vol.describe(),
        backend: backend.into(),
        files: want.0,
        bytes: want.1,
        rows,
        registry_rss_mib,
    })
}

/// A two-line script that runs `vial` with the open-file limit lowered (as `limited` runs every
/// other client): [`Mounted`] takes a program, not a command line.
fn limited_vial(dir: &Path, vial: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let vial = std::path::absolute(vial)?;
    let quoted = vial.display().to_string().replace('\'', r"'\''");
    let script = dir.join("vial-nofile");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nulimit -n {} && exec '{quoted}' \"$@\"\n",
            measure::NOFILE
        ),
    )?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok(script)
}

pub async fn tree(mut args: TreeArgs) -> Result<()> {
    let quick = args.quick;
    if args.volumes.is_empty() {
        args.volumes = if quick {
            vec![s("10k"), s("mixed")]
        } else {
            vec![s("10k"), s("100k"), s("mixed")]
        };
    }
    if args.backends.is_empty() {
        args.backends = if quick {
            vec![s("disk")]
        } else {
            vec![s("disk"), s("s3")]
        };
    }
    if let Some(b) = args
        .backends
        .iter()
        .find(|b| !matches!(b.as_str(), "disk" | "s3"))
    {
        bail!("unknown backend {b:?}: disk or s3");
    }
    let volumes: Vec<Volume> = args
        .volumes
        .iter()
        .map(|v| Volume::named(v, quick))
        .collect::<Result<_>>()?;
    args.s3s_fs = crate::pushers::absolute_program(&args.s3s_fs);
    let bench = std::env::current_exe().context("cannot find vial-bench itself")?;
    let _pinned = (!args.keep_page_reporting).then(crate::hostmem::Pinned::start);
    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = WorkDir::create(&parent, false)?;
    let limited_vial = limited_vial(&work.path, &args.vial)?;
    let mut results = Results {
        machine: machine(),
        vial_version: servers::first_line(&args.vial, &["--version"]),
        nofile: measure::NOFILE,
        ..Results::default()
    };
    report::header(&results, quick);
    let ctx = Ctx {
        args: &args,
        bench: &bench,
        limited_vial: &limited_vial,
        work: &work.path,
    };
    for vol in &volumes {
        let src = work.path.join(format!("volume-{}", vol.name));
        eprintln!("vial-bench: writing {}", vol.describe());
        vol.write(&src)?;
        for backend in &args.backends {
            match run_volume(&ctx, vol, &src, backend).await {
                Ok(r) => results.runs.push(r),
                Err(e) => eprintln!("vial-bench: {} on {backend} failed: {e:#}", vol.describe()),
            }
        }
        std::fs::remove_dir_all(&src)?;
    }
    report::report(&mut results);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)?;
    }
    Ok(())
}
