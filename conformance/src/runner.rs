//! The suite's entry point: the order the areas run in, and the base (`GET /v2/`) check.

use crate::check::{fail, pass, pass_with, Problem, Recorder};
use crate::client::Client;
use crate::config::Config;
use crate::fixtures::Ctx;
use crate::report::Report;
use crate::{discovery, errors, expect, management, manifests, pull, push};

/// Runs every check against the registry and returns their results. Never panics: an unreachable
/// registry gives a report in which every check failed with the transport error.
pub async fn run(config: &Config) -> Report {
    let mut rec = Recorder::new(&config.skip);
    let client = match Client::new(&config.base_url) {
        Ok(c) => c,
        Err(e) => {
            rec.record(BASE_ID, BASE_DESCRIPTION, Err(Problem::Fail(e)));
            return Report {
                results: rec.into_results(),
            };
        }
    };
    let ctx = Ctx { client, config };
    base(&ctx, &mut rec).await;
    push::run(&ctx, &mut rec).await;
    manifests::run(&ctx, &mut rec).await;
    pull::run(&ctx, &mut rec).await;
    discovery::run(&ctx, &mut rec).await;
    management::run(&ctx, &mut rec).await;
    errors::run(&ctx, &mut rec).await;
    Report {
        results: rec.into_results(),
    }
}

const BASE_ID: &str = "base.v2";
const BASE_DESCRIPTION: &str = "GET /v2/ answers 200 OK (unauthenticated)";

async fn base(ctx: &Ctx<'_>, rec: &mut Recorder) {
    rec.run(BASE_ID, BASE_DESCRIPTION, async {
        let resp = ctx.client.get("/v2/").await?;
        if resp.status == 401 {
            let challenge = resp.header("WWW-Authenticate").unwrap_or("none");
            return fail(format!(
                "401 Unauthorized (WWW-Authenticate: {challenge}); the suite runs without credentials"
            ));
        }
        expect::status(&resp, 200)?;
        match resp.header("Docker-Distribution-API-Version") {
            Some(v) if v.trim() == "registry/2.0" => pass(),
            Some(v) => pass_with(format!("Docker-Distribution-API-Version is {v:?}")),
            None => pass_with("no Docker-Distribution-API-Version header (optional)"),
        }
    })
    .await;
}
