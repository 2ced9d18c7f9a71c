//! `gpuctl share`: fair share per account and user, like Slurm's `sshare`.

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};
use crate::format;

#[derive(Serialize)]
pub struct ShareRow {
    account: String,
    user: String,
    norm_shares: f64,
    account_shares: f64,
    usage_gpu_hours: f64,
    effective_usage: f64,
    fair_share: f64,
}

#[derive(Serialize)]
pub struct Share {
    half_life: String,
    rows: Vec<ShareRow>,
}

impl View for Share {
    fn text(&self) -> String {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.account.clone(),
                    r.user.clone(),
                    format!("{:.4}", r.norm_shares),
                    format!("{:.2}", r.usage_gpu_hours),
                    format!("{:.4}", r.effective_usage),
                    format!("{:.3}", r.fair_share),
                ]
            })
            .collect();
        let mut out = format::table(
            &[
                "ACCOUNT",
                "USER",
                "NORMSHARES",
                "USAGE(GPU-H)",
                "EFFECTVUSAGE",
                "FAIRSHARE",
            ],
            rows,
        );
        out.push_str(&format!(
            "usage decays by half every {}; FAIRSHARE 1 = nothing used lately, 0.5 = used exactly its share\n",
            self.half_life
        ));
        out
    }
}

pub async fn run(client: &mut Client) -> Result<Share, Failure> {
    let r = client.share(pb::ShareRequest {}).await?.into_inner();
    Ok(Share {
        half_life: r.half_life,
        rows: r
            .rows
            .into_iter()
            .map(|r| ShareRow {
                account: r.account,
                user: r.user,
                norm_shares: r.norm_shares,
                account_shares: r.account_shares,
                usage_gpu_hours: r.usage_gpu_hours,
                effective_usage: r.effective_usage,
                fair_share: r.fair_share,
            })
            .collect(),
    })
}
