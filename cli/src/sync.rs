//! `vial sync`: have the registry copy a bucket, another registry's artifact or a Hugging Face Hub
//! repository into a sealed version, as a durable job that survives registry restarts.

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use vial_client::{Registry, SyncJob, SyncRequest};
use vial_core::Reference;

use crate::common::{block_on, human_bytes, parse_reference, print_json, RegistryArgs};

#[derive(Debug, Args)]
pub struct SyncArgs {
    #[command(subcommand)]
    command: SyncCommand,
}

#[derive(Debug, Subcommand)]
enum SyncCommand {
    /// Start a sync job: the registry copies SOURCE into a new sealed version tagged TAG.
    Start(StartArgs),
    /// Show a sync job: state, progress, the sealed version or why it failed.
    Status(StatusArgs),
    /// List a volume's sync jobs, newest first.
    Ls(LsArgs),
    /// Cancel a sync job that has not finished.
    Cancel(CancelArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "Sources:\n  s3://BUCKET/PREFIX          every object under the prefix; keys become paths\n  oci://HOST/REPO:TAG|@DIGEST  a vial volume is mirrored with its digest unchanged; a file\n                               artifact (oras, ModelPack, Docker model) is copied and sealed\n  hf://ORG/REPO[@REVISION]     a Hugging Face Hub model (hf://datasets/ORG/REPO for a dataset)\n\nThe data goes from the source to the registry directly, never through this machine. The\nregistry reads only sources its operator allowed ([[sync-sources]] in its config), with the\nendpoints and credentials configured there: none are ever passed in a job.\n\nExamples:\n  vial sync start --source s3://training/run-42/step-9000 --dest localhost:5000/weights/run42:step-9000 --wait\n  vial sync start --source hf://Qwen/Qwen3-8B --dest localhost:5000/weights/qwen3-8b:main \\\n      --include '*.safetensors' --include '*.json' --wait\n  vial sync start --source oci://ghcr.io/acme/llama:v1 --dest localhost:5000/mirror/llama:v1\n  vial sync status localhost:5000/weights/qwen3-8b 6f1c…  --wait\n\nA job survives registry restarts and resumes without copying again the files it finished."
)]
struct StartArgs {
    /// What to copy: s3://…, oci://… or hf://…
    #[arg(long)]
    source: String,
    /// Where: HOST/NAME:TAG. The tag moves to the sealed version when the job finishes.
    #[arg(long)]
    dest: String,
    /// Copy only paths matching this glob (repeatable; `*` matches across `/`).
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Leave out paths matching this glob (repeatable).
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// The registry reaches an oci:// source over plain HTTP.
    #[arg(long)]
    source_plain_http: bool,
    /// Wait for the job and print the sealed version's pinned reference.
    #[arg(long)]
    wait: bool,
    /// Print the job as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// The volume: HOST/NAME
    volume: String,
    /// The job's id, as `vial sync start` or `vial sync ls` printed it.
    id: String,
    /// Wait for the job to finish; prints the pinned reference, or fails with the job's error.
    #[arg(long)]
    wait: bool,
    /// Print the result as JSON, for scripts, instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Args)]
struct LsArgs {
    /// The volume: HOST/NAME
    volume: String,
    /// Print the result as JSON, for scripts, instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Args)]
struct CancelArgs {
    /// The volume: HOST/NAME
    volume: String,
    id: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

pub fn run(args: SyncArgs) -> anyhow::Result<()> {
    match args.command {
        SyncCommand::Start(a) => start(a),
        SyncCommand::Status(a) => status(a),
        SyncCommand::Ls(a) => ls(a),
        SyncCommand::Cancel(a) => cancel(a),
    }
}

#[allow(clippy::print_stdout)]
fn start(args: StartArgs) -> anyhow::Result<()> {
    let dest = parse_reference(&args.dest)?;
    let tag = dest
        .tag()
        .with_context(|| format!("--dest {} needs a tag (HOST/NAME:TAG)", args.dest))?
        .to_string();
    anyhow::ensure!(
        dest.digest().is_none(),
        "--dest names a tag to move, not a digest: the digest is what the sync produces"
    );
    let registry = args.registry.connect(dest.registry())?;
    block_on(async {
        let request = SyncRequest {
            source: args.source.clone(),
            tag,
            include: args.include.clone(),
            exclude: args.exclude.clone(),
            plain_http: args.source_plain_http,
        };
        let job = registry
            .sync_start(dest.repo(), &request)
            .await
            .with_context(|| format!("could not start a sync into {dest}"))?;
        if !args.wait {
            if args.json {
                print_json(&job)?;
            } else {
                eprintln!(
                    "sync queued; follow it with: vial sync status {}/{} {} --wait",
                    dest.registry(),
                    dest.repo(),
                    job.id
                );
                println!("{}", job.id);
            }
            return Ok(());
        }
        eprintln!("sync {} started: {} -> {dest}", job.id, args.source);
        let job = wait_for(&registry, &dest, &job.id).await?;
        finish(&dest, &job, args.json)
    })
}

#[allow(clippy::print_stdout)]
fn status(args: StatusArgs) -> anyhow::Result<()> {
    let volume = parse_reference(&args.volume)?;
    let registry = args.registry.connect(volume.registry())?;
    block_on(async {
        if args.wait {
            let job = wait_for(&registry, &volume, &args.id).await?;
            return finish(&volume, &job, args.json);
        }
        let job = registry
            .sync_status(volume.repo(), &args.id, Duration::ZERO)
            .await?;
        if args.json {
            return print_json(&job);
        }
        println!("job:      {}", job.id);
        println!("source:   {}", job.source);
        println!("tag:      {}", job.tag);
        println!("state:    {}", job.state);
        println!("progress: {}", describe_progress(&job));
        if job.attempts > 1 {
            println!("attempts: {}", job.attempts);
        }
        if let Some(d) = &job.digest {
            println!("version:  {}", volume.pinned(d.clone()));
        }
        if let Some(e) = &job.error {
            println!(
                "{}    {e}",
                if job.state == "failed" {
                    "error:"
                } else {
                    "last error:"
                }
            );
        }
        Ok(())
    })
}

#[allow(clippy::print_stdout)]
fn ls(args: LsArgs) -> anyhow::Result<()> {
    let volume = parse_reference(&args.volume)?;
    let registry = args.registry.connect(volume.registry())?;
    block_on(async {
        let jobs = registry.sync_list(volume.repo()).await?;
        if args.json {
            return print_json(&jobs);
        }
        if jobs.is_empty() {
            eprintln!("no sync jobs in {volume}");
            return Ok(());
        }
        println!(
            "{:<36}  {:<7}  {:<20}  {:<22}  SOURCE",
            "ID", "STATE", "TAG", "PROGRESS"
        );
        for job in &jobs {
            println!(
                "{:<36}  {:<7}  {:<20}  {:<22}  {}",
                job.id,
                job.state,
                job.tag,
                describe_progress(job),
                job.source
            );
        }
        Ok(())
    })
}

fn cancel(args: CancelArgs) -> anyhow::Result<()> {
    let volume = parse_reference(&args.volume)?;
    let registry = args.registry.connect(volume.registry())?;
    block_on(async {
        let job = registry.sync_cancel(volume.repo(), &args.id).await?;
        eprintln!(
            "sync {} {}",
            job.id,
            job.error.as_deref().unwrap_or("cancelled")
        );
        Ok(())
    })
}

fn describe_progress(job: &SyncJob) -> String {
    let p = &job.progress;
    if p.files_total == 0 {
        return "-".into();
    }
    format!(
        "{}/{} files, {}/{}",
        p.files_done,
        p.files_total,
        human_bytes(p.bytes_done),
        human_bytes(p.bytes_total)
    )
}

/// Follows a job until it finishes, drawing its progress on a terminal.
async fn wait_for(registry: &Registry, volume: &Reference, id: &str) -> anyhow::Result<SyncJob> {
    use std::io::IsTerminal;
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new(0)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>8} {bar:30} {binary_bytes:>10}/{binary_total_bytes:<10} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix("sync");
    loop {
        let job = registry
            .sync_status(volume.repo(), id, Duration::from_secs(10))
            .await?;
        bar.set_length(job.progress.bytes_total);
        bar.set_position(job.progress.bytes_done);
        bar.set_message(format!(
            "{}/{} files, {}",
            job.progress.files_done, job.progress.files_total, job.state
        ));
        if job.state == "done" || job.state == "failed" {
            bar.finish_and_clear();
            return Ok(job);
        }
    }
}

#[allow(clippy::print_stdout)]
fn finish(volume: &Reference, job: &SyncJob, json: bool) -> anyhow::Result<()> {
    if json {
        print_json(job)?;
    }
    match (&job.digest, job.state.as_str()) {
        (Some(digest), "done") => {
            if !json {
                eprintln!(
                    "synced {} into {}:{} ({}, read {} from the source)",
                    job.source,
                    volume.repo(),
                    job.tag,
                    describe_progress(job),
                    human_bytes(job.progress.bytes_read)
                );
                println!("{}", volume.pinned(digest.clone()));
            }
            Ok(())
        }
        _ => anyhow::bail!(
            "sync {} of {} failed: {}",
            job.id,
            job.source,
            job.error.as_deref().unwrap_or("no reason recorded")
        ),
    }
}
