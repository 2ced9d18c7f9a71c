//! `gpuctl share`: fair share per account and user, like Slurm's `sshare`.

use gpuctl_core::view::ShareRow;
use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};
use crate::format;

/// An account's line: its share of the cluster and its users' usage together.
#[derive(Serialize)]
pub struct AccountRow {
    account: String,
    account_shares: f64,
    usage_gpu_hours: f64,
    effective_usage: f64,
}

#[derive(Serialize)]
pub struct Share {
    half_life: String,
    accounts: Vec<AccountRow>,
    rows: Vec<ShareRow>,
}

/// The account lines of `rows` (in account order).
fn accounts(rows: &[ShareRow]) -> Vec<AccountRow> {
    let mut out: Vec<AccountRow> = Vec::new();
    for r in rows {
        match out.iter_mut().find(|a| a.account == r.account) {
            Some(a) => {
                a.usage_gpu_hours += r.usage_gpu_hours;
                a.effective_usage += r.effective_usage;
            }
            None => out.push(AccountRow {
                account: r.account.clone(),
                account_shares: r.account_shares,
                usage_gpu_hours: r.usage_gpu_hours,
                effective_usage: r.effective_usage,
            }),
        }
    }
    out.sort_by(|a, b| a.account.cmp(&b.account));
    out
}

impl View for Share {
    fn text(&self) -> String {
        // Each account's line, then its users' (indented), as sshare prints the tree.
        let mut rows = Vec::new();
        for a in &self.accounts {
            rows.push(vec![
                a.account.clone(),
                String::new(),
                format!("{:.4}", a.account_shares),
                format!("{:.2}", a.usage_gpu_hours),
                format!("{:.4}", a.effective_usage),
                String::new(),
            ]);
            for r in self.rows.iter().filter(|r| r.account == a.account) {
                rows.push(vec![
                    format!(" {}", r.account),
                    r.user.clone(),
                    format!("{:.4}", r.norm_shares),
                    format!("{:.2}", r.usage_gpu_hours),
                    format!("{:.4}", r.effective_usage),
                    format!("{:.3}", r.fair_share),
                ]);
            }
        }
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
    let rows: Vec<ShareRow> = r.rows.into_iter().map(ShareRow::from).collect();
    Ok(Share {
        half_life: r.half_life,
        accounts: accounts(&rows),
        rows,
    })
}
