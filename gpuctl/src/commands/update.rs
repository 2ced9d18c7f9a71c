//! `gpuctl update` (and `scontrol update JobId=N ...`): a job's time limit, partition,
//! name, comment or nice after its submit. The controller decides who may change
//! what (Slurm's rules: owners lower, admins also raise).

use gpuctl_proto as pb;

use super::hold::{Done, Results};
use crate::cli::{Client, Failure, fail};

#[derive(clap::Args, Debug, Clone, Default)]
pub struct UpdateArgs {
    /// The jobs: ids, comma-separated or several.
    #[arg(required = true, value_name = "JOB", value_delimiter = ',')]
    pub job_ids: Vec<u64>,
    /// The new time limit: Slurm's formats (M, H:M:S, D-H...) or "2h 30m"; +T or -T
    /// changes it by T; UNLIMITED is the longest the partition and cluster allow.
    #[arg(
        short = 't',
        long = "time",
        value_name = "LIMIT",
        allow_hyphen_values = true
    )]
    pub time: Option<String>,
    /// Another partition (a pending job only).
    #[arg(short, long)]
    pub partition: Option<String>,
    /// A new name.
    #[arg(short = 'J', long)]
    pub name: Option<String>,
    /// A new comment.
    #[arg(long)]
    pub comment: Option<String>,
    /// The job's nice: larger lowers its priority (a negative one is an admin's).
    #[arg(long, allow_hyphen_values = true)]
    pub nice: Option<i32>,
    #[arg(long)]
    pub json: bool,
}

/// A new time limit as given: seconds, a change by seconds, or UNLIMITED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewLimit {
    Set(u64),
    Add(u64),
    Sub(u64),
    Unlimited,
}

impl NewLimit {
    /// Reads `--time` / `TimeLimit=`.
    pub fn parse(v: &str) -> Result<NewLimit, String> {
        if matches!(v.to_ascii_lowercase().as_str(), "unlimited" | "infinite") {
            return Ok(NewLimit::Unlimited);
        }
        let secs = |t: &str| crate::submit::time_limit(t).map(|d| d.as_secs());
        Ok(match (v.strip_prefix('+'), v.strip_prefix('-')) {
            (Some(t), _) => NewLimit::Add(secs(t)?),
            (_, Some(t)) => NewLimit::Sub(secs(t)?),
            _ => NewLimit::Set(secs(v)?),
        })
    }

    /// The limit to ask for, from the job's `now` (0: UNLIMITED).
    fn resolve(self, now: u64, id: u64) -> Result<u64, Failure> {
        match self {
            NewLimit::Set(s) => Ok(s),
            NewLimit::Unlimited => Ok(0),
            NewLimit::Add(s) => Ok(now.saturating_add(s)),
            NewLimit::Sub(s) if s < now => Ok(now - s),
            NewLimit::Sub(_) => Err(fail(format!(
                "job {id}: its time limit is {now} s; taking that much or more leaves none"
            ))),
        }
    }

    fn relative(self) -> bool {
        matches!(self, NewLimit::Add(_) | NewLimit::Sub(_))
    }
}

/// What an update asks, before the job ids it goes to.
#[derive(Debug, Clone, Default)]
pub struct Update {
    pub time: Option<NewLimit>,
    pub partition: Option<String>,
    pub name: Option<String>,
    pub comment: Option<String>,
    pub priority: Option<i32>,
}

impl Update {
    pub fn of(a: &UpdateArgs) -> Result<Update, Failure> {
        let time = (a.time.as_deref())
            .map(NewLimit::parse)
            .transpose()
            .map_err(fail)?;
        Ok(Update {
            time,
            partition: a.partition.clone(),
            name: a.name.clone(),
            comment: a.comment.clone(),
            priority: a.nice.map(|n| n.saturating_neg()),
        })
    }
}

/// Applies `update` to each job in turn; stops at the first the controller refuses.
pub async fn run(client: &mut Client, ids: &[u64], update: &Update) -> Result<Results, Failure> {
    let mut out = Vec::new();
    for &job_id in ids {
        let time_limit_secs = match update.time {
            None => None,
            Some(t) if t.relative() => {
                let j = client.get_job(pb::GetJobRequest { job_id }).await?;
                Some(t.resolve(j.into_inner().time_limit_secs, job_id)?)
            }
            Some(t) => Some(t.resolve(0, job_id)?),
        };
        let req = pb::UpdateJobRequest {
            job_id,
            time_limit_secs,
            partition: update.partition.clone(),
            name: update.name.clone(),
            comment: update.comment.clone(),
            priority: update.priority,
        };
        let j = client.update_job(req).await?.into_inner();
        out.push(Done::of(&j));
    }
    Ok(Results(out))
}

#[cfg(test)]
mod tests {
    use super::NewLimit;

    #[test]
    fn limits_as_slurm_writes_them() {
        assert_eq!(NewLimit::parse("30"), Ok(NewLimit::Set(1800)));
        assert_eq!(NewLimit::parse("1:00:00"), Ok(NewLimit::Set(3600)));
        assert_eq!(NewLimit::parse("+10"), Ok(NewLimit::Add(600)));
        assert_eq!(NewLimit::parse("-1:00"), Ok(NewLimit::Sub(60)));
        assert_eq!(NewLimit::parse("UNLIMITED"), Ok(NewLimit::Unlimited));
        assert_eq!(NewLimit::parse("2h"), Ok(NewLimit::Set(7200)));
        assert!(NewLimit::parse("soon").is_err());
        assert!(NewLimit::parse("0").is_err());
        assert_eq!(NewLimit::Sub(60).resolve(600, 1).unwrap(), 540);
        assert!(NewLimit::Sub(600).resolve(600, 1).is_err());
        assert_eq!(NewLimit::Add(60).resolve(600, 1).unwrap(), 660);
    }
}
