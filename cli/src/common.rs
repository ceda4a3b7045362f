//! What every registry subcommand shares: connection flags, reference parsing, progress bars and
//! human-readable sizes.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use vial_client::progress::{Event, Progress};
use vial_client::{Mirror, Registry, RegistryOptions};
use vial_core::Reference;

#[derive(Debug, Clone, Args)]
pub struct RegistryArgs {
    /// Talk to the registry over plain HTTP (loopback hosts always use plain HTTP).
    #[arg(long, env = "VIAL_PLAIN_HTTP", global = true)]
    pub plain_http: bool,

    /// Read ORIGIN's volumes and images through the cache at URL (`vial serve --upstream`),
    /// e.g. registry.example.com=http://vial-cache.vial:5000 (repeatable, or comma-separated in
    /// VIAL_MIRROR; a node's default in `mirrors = [...]` of /etc/vial/node.toml or
    /// $VIAL_NODE_CONFIG). Writes still go to ORIGIN, and reads too while the cache does not
    /// answer.
    #[arg(
        long,
        env = "VIAL_MIRROR",
        value_delimiter = ',',
        global = true,
        value_name = "ORIGIN=URL"
    )]
    pub mirror: Vec<Mirror>,
}

impl RegistryArgs {
    pub fn options(&self) -> RegistryOptions {
        let mut mirrors = self.mirror.clone();
        // The node's file comes after the flags: the first mirror named for an origin wins.
        mirrors.extend(node_mirrors());
        RegistryOptions {
            plain_http: self.plain_http,
            mirrors,
            ..RegistryOptions::default()
        }
    }

    pub fn connect(&self, host: &str) -> anyhow::Result<Registry> {
        Registry::new(host, &self.options()).with_context(|| format!("cannot use registry {host}"))
    }
}

/// The node config file's mirrors (`mirrors = ["ORIGIN=URL", …]`); none when there is no file.
/// A file that is there but wrong is reported, not ignored.
fn node_mirrors() -> Vec<Mirror> {
    let path = std::env::var_os("VIAL_NODE_CONFIG").map_or_else(
        || std::path::PathBuf::from("/etc/vial/node.toml"),
        Into::into,
    );
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Vec::new();
    };
    match parse_node_mirrors(&text) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "ignoring the node config file");
            Vec::new()
        }
    }
}

fn parse_node_mirrors(text: &str) -> Result<Vec<Mirror>, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NodeConfig {
        #[serde(default)]
        mirrors: Vec<String>,
    }
    let config: NodeConfig = toml::from_str(text).map_err(|e| e.to_string())?;
    config.mirrors.iter().map(|m| m.parse()).collect()
}

pub fn parse_reference(s: &str) -> anyhow::Result<Reference> {
    Reference::parse(s).with_context(|| format!("invalid reference {s:?}"))
}

/// Runs an async body on a fresh multi-threaded runtime.
pub fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("could not start the async runtime")?
        .block_on(f)
}

/// `1 file`, `2 files`: a count with its noun, singular or plural.
pub fn count(n: u64, noun: &str) -> String {
    // Every noun vial counts takes a plain -s ("file", "chunk", "blob", "manifest", "version").
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

pub use vial_core::human_bytes;

/// Two bars on stderr, drawn only when stderr is a terminal: bytes read and hashed, bytes moved.
pub struct Bars {
    _multi: indicatif::MultiProgress,
    read: ProgressBar,
    transfer: ProgressBar,
}

impl Bars {
    pub fn new(read_label: &str, transfer_label: &str, enabled: bool) -> Arc<Bars> {
        let multi = indicatif::MultiProgress::with_draw_target(if enabled {
            indicatif::ProgressDrawTarget::stderr()
        } else {
            indicatif::ProgressDrawTarget::hidden()
        });
        let style = ProgressStyle::with_template(
            "{prefix:>10} {bar:30} {binary_bytes:>10}/{binary_total_bytes:<10} {binary_bytes_per_sec:>12} {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        let read = multi.add(
            ProgressBar::new(0)
                .with_style(style.clone())
                .with_prefix(read_label.to_owned()),
        );
        let transfer = multi.add(
            ProgressBar::new(0)
                .with_style(style)
                .with_prefix(transfer_label.to_owned()),
        );
        Arc::new(Bars {
            _multi: multi,
            read,
            transfer,
        })
    }

    pub fn finish(&self) {
        self.read.finish();
        self.transfer.finish();
    }
}

impl Progress for Bars {
    fn event(&self, event: Event) {
        match event {
            Event::Scanned { bytes, .. } => self.read.set_length(bytes),
            Event::Hashed(n) => self.read.inc(n),
            Event::Needed(n) => self.transfer.inc_length(n),
            Event::Transferred(n) => self.transfer.inc(n),
        }
    }
}

/// Prints a value as pretty JSON on stdout, streamed (a million entries are never one string).
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut out = stdout();
    serde_json::to_writer_pretty(&mut out, value).map_err(std::io::Error::from)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

/// Standard output, buffered: for listings of many lines (each `println!` is a write).
pub fn stdout() -> std::io::BufWriter<std::io::StdoutLock<'static>> {
    std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock())
}

/// Whether an error is standard output's reader having gone (`vial inspect … | head`): not a
/// failure to report.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_config_names_mirrors_and_a_wrong_one_is_an_error() {
        let mirrors =
            parse_node_mirrors("mirrors = [\"registry.example.com=http://vial-cache:5000\"]\n")
                .unwrap();
        assert_eq!(
            mirrors,
            [Mirror {
                origin: "registry.example.com".into(),
                url: "http://vial-cache:5000".into()
            }]
        );
        assert!(parse_node_mirrors("mirrors = [\"no-equals-sign\"]").is_err());
        assert!(
            parse_node_mirrors("mirror = []").is_err(),
            "a typo is not ignored"
        );
        assert!(parse_node_mirrors("").unwrap().is_empty());
    }
}
