//! `gpuctl cancel JOB...` and `gpuctl cancel --me|-u|-t|--name|-A|-p` (scancel's filters).

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure, exit, fail};

#[derive(clap::Args, Debug, Clone)]
#[command(group = clap::ArgGroup::new("what").required(true).multiple(true))]
pub struct CancelArgs {
    /// Jobs: ids, an array's id (every task), tasks (12_3) or task lists (12_[1-5,9]).
    #[arg(value_name = "JOB", group = "what")]
    pub job_ids: Vec<String>,
    /// Every unfinished job of yours.
    #[arg(long, group = "what")]
    pub me: bool,
    /// Jobs of these users (admins name others).
    #[arg(short = 'u', long = "user", value_delimiter = ',', group = "what")]
    pub users: Vec<String>,
    /// Jobs in these states: PENDING, RUNNING (or PD, R).
    #[arg(short = 't', long = "state", value_delimiter = ',', group = "what")]
    pub states: Vec<String>,
    /// Jobs with these names.
    #[arg(short = 'n', long = "name", value_delimiter = ',', group = "what")]
    pub names: Vec<String>,
    /// Jobs charged to these accounts.
    #[arg(short = 'A', long = "account", value_delimiter = ',', group = "what")]
    pub accounts: Vec<String>,
    /// Jobs of these partitions.
    #[arg(short = 'p', long = "partition", value_delimiter = ',', group = "what")]
    pub partitions: Vec<String>,
}

impl CancelArgs {
    /// The filter part, when one is given (`--me` asks the controller who you are).
    async fn filter(&self, client: &mut Client) -> Result<Option<pb::ListJobsRequest>, Failure> {
        let f = super::queue::Filters {
            me: self.me,
            users: &self.users,
            states: &self.states,
            names: &self.names,
            accounts: &self.accounts,
            partitions: &self.partitions,
        }
        .request(client)
        .await?;
        if let Some(done) = f.states().find(|s| s.is_final()) {
            return Err(fail(format!(
                "-t {}: finished jobs cannot be cancelled (PENDING or RUNNING)",
                done.as_str_name()
            )));
        }
        let narrows = gpuctl_core::filter::JobFilter::try_from(&f).is_ok_and(|j| j.narrows());
        Ok(narrows.then_some(f))
    }
}

#[derive(Serialize)]
pub struct Outcome {
    job_id: u64,
    message: String,
    ok: bool,
}

#[derive(Serialize)]
#[serde(transparent)]
pub struct Cancelled {
    results: Vec<Outcome>,
    /// Signalled (`--signal`), not cancelled.
    #[serde(skip)]
    signalled: bool,
}

impl View for Cancelled {
    /// The jobs cancelled or being killed; refusals go to stderr (`failure`).
    fn text(&self) -> String {
        self.results
            .iter()
            .filter(|r| r.ok)
            .map(|r| format!("Job {}: {}\n", r.job_id, r.message))
            .collect()
    }
}

impl Cancelled {
    /// The jobs that were not cancelled, each on stderr, as a failure of the command.
    /// A job that had already finished is said so, and is not a failure: what was
    /// asked (that it not run) holds, and scancel exits 0 there too.
    pub fn failure(&self) -> Option<Failure> {
        let refused: Vec<&Outcome> = self.results.iter().filter(|r| !r.ok).collect();
        for r in &refused {
            eprintln!("gpuctl: job {}: {}", r.job_id, r.message);
        }
        let refused: Vec<&Outcome> = refused
            .into_iter()
            .filter(|r| !r.message.starts_with("already finished"))
            .collect();
        let what = if self.signalled {
            "signalled"
        } else {
            "cancelled"
        };
        (!refused.is_empty()).then(|| Failure {
            code: exit::FAILED,
            message: format!("some jobs were not {what}"),
        })
    }
}

/// `12` (a job, or a whole array), `12_3` (one task of array 12), `12_[1-5,9]` (some).
pub fn parse_targets(args: &[String]) -> Result<(Vec<u64>, Vec<pb::ArrayTask>), Failure> {
    let bad = |a: &str| {
        fail(format!(
            "{a:?} is not a job: write a job id (12), an array task (12_3) or tasks (12_[1-5,9])"
        ))
    };
    let (mut ids, mut tasks) = (Vec::new(), Vec::new());
    for a in args {
        let a = a.trim();
        let Some((job, task)) = a.split_once('_') else {
            ids.push(a.parse().map_err(|_| bad(a))?);
            continue;
        };
        let array_job_id: u64 = job.parse().map_err(|_| bad(a))?;
        let list = task
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(task);
        if list.contains(['%', ':']) && !task.starts_with('[') {
            return Err(bad(a));
        }
        let spec = gpuctl_sched::array::parse(list, 1_000_000)
            .map_err(|why| fail(format!("{a:?}: {why}")))?;
        tasks.extend(spec.tasks.into_iter().map(|task_id| pb::ArrayTask {
            array_job_id,
            task_id,
        }));
    }
    Ok((ids, tasks))
}

/// Cancels the jobs `args` names, or with `signal` sends them that signal and leaves
/// them running (`--signal USR1`, `scancel -s USR1`).
pub async fn run(
    client: &mut Client,
    args: &CancelArgs,
    signal: Option<&str>,
) -> Result<Cancelled, Failure> {
    let (job_ids, tasks) = parse_targets(&args.job_ids)?;
    let filter = args.filter(client).await?;
    let results = client
        .cancel(pb::CancelRequest {
            job_ids,
            tasks,
            filter,
            signal: signal.unwrap_or_default().to_string(),
        })
        .await?
        .into_inner()
        .results
        .into_iter()
        .map(|r| Outcome {
            job_id: r.job_id,
            message: r.message,
            ok: r.ok,
        })
        .collect();
    Ok(Cancelled {
        results,
        signalled: signal.is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_name_jobs_tasks_and_task_lists() {
        let args: Vec<String> = ["12", "12_3", "40_[1-3,7]"].map(String::from).to_vec();
        let (ids, tasks) = parse_targets(&args).unwrap();
        assert_eq!(ids, vec![12]);
        let t: Vec<(u64, u32)> = tasks.iter().map(|t| (t.array_job_id, t.task_id)).collect();
        assert_eq!(t, vec![(12, 3), (40, 1), (40, 2), (40, 3), (40, 7)]);
        for bad in ["x", "12_", "12_a", "_3", "12_3%2"] {
            let e = parse_targets(&[bad.to_string()]).unwrap_err();
            assert!(e.message.contains(bad), "{bad}: {}", e.message);
        }
    }
}
