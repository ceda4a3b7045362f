//! `vial login`: store registry credentials where every registry client reads them.

use std::io::Read;

use anyhow::{bail, Context};
use clap::Args;
use vial_client::auth::{store_credentials, Credentials};
use vial_client::{Registry, RegistryOptions};

use crate::common::block_on;

#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  echo \"$TOKEN\" | vial login registry.example.com -u ci --password-stdin"
)]
pub struct LoginArgs {
    /// Registry host[:port].
    registry: String,
    #[arg(long, short = 'u')]
    username: String,
    /// Read the password from standard input (the only way: passwords do not belong in argv).
    #[arg(long)]
    password_stdin: bool,
    /// Talk to the registry over plain HTTP.
    #[arg(long)]
    plain_http: bool,
}

pub fn run(args: LoginArgs) -> anyhow::Result<()> {
    if !args.password_stdin {
        bail!("pass the password on standard input with --password-stdin");
    }
    let mut password = String::new();
    std::io::stdin()
        .read_to_string(&mut password)
        .context("cannot read the password from stdin")?;
    let credentials = Credentials {
        username: args.username.clone(),
        password: password.trim_end_matches(['\n', '\r']).to_owned(),
    };
    let options = RegistryOptions {
        plain_http: args.plain_http,
        credentials: Some(credentials.clone()),
        ..RegistryOptions::default()
    };
    let registry = Registry::new(&args.registry, &options)?;
    block_on(async {
        registry
            .ping()
            .await
            .with_context(|| format!("login to {} failed", args.registry))
    })?;
    let path = store_credentials(&args.registry, &credentials)?;
    eprintln!(
        "logged in to {} as {}; credentials saved in {}",
        args.registry,
        args.username,
        path.display()
    );
    Ok(())
}
