//! `gpuctl explain`: why a job waits, in words, node by node. Pure: the state's answer
//! where it needs no pass (running, held, a partition or dependencies), else the
//! inputs of a fresh read-only pass for the shell to run (`sched::explain`, which may
//! take a while on a large queue) and `rendered` to put its finding in words.

use gpuctl_sched::{self as sched, ClusterView, PendingJob};
use std::time::{Duration, UNIX_EPOCH};

use crate::error::Refusal;
use crate::record::{JobState, state_name};
use crate::state::Cluster;
use crate::view::{Explanation, NodeExplain};

/// What `Cluster::explain` answers.
pub enum Explain {
    /// The whole answer.
    Done(Explanation),
    /// The answer so far, and a read-only pass's inputs.
    Pass(Box<PassInput>),
}

/// Run `sched::explain` on `view`, `queue` and `cfg` (for the job, at the same `now`),
/// then `rendered` with `base`.
pub struct PassInput {
    pub base: Explanation,
    pub view: ClusterView,
    pub queue: Vec<PendingJob>,
    pub cfg: sched::SchedConfig,
}

impl Cluster {
    /// Why job `id` waits, as far as the state says without a pass; else what a
    /// fresh pass needs (see `Explain`).
    pub fn explain(&self, id: u64, now: i64) -> Result<Explain, Refusal> {
        let job = self
            .jobs
            .job(id)
            .map(crate::jobs::presented)
            .ok_or_else(|| Refusal::not_found(format!("no job {id}")))?;
        let state = job.state;
        let mut out = Explanation::new(id, state, &job.reason);
        if job.state != JobState::Pending {
            out.summary = match job.state {
                // A borrower of a window's floor says so (its reason).
                JobState::Running if job.reason.starts_with("Borrowing") => format!(
                    "running on {}; {}: its owner's jobs take it back (signal, requeue)",
                    job.node,
                    job.reason.to_lowercase()
                ),
                JobState::Running => format!("running on {}", job.node),
                s => format!("finished: {}", state_name(s)),
            };
            return Ok(Explain::Done(out));
        }
        if !job.hold.is_empty() {
            out.summary = format!(
                "held by {}: it starts only once released (gpuctl release {id})",
                if job.hold == "admin" {
                    "an admin"
                } else {
                    "its owner"
                }
            );
            return Ok(Explain::Done(out));
        }
        if let Some(why) = self.mig_wait_of(id) {
            out.reason = crate::mig::MIG_LAYOUT_CHANGE.into();
            out.summary = why;
            return Ok(Explain::Done(out));
        }
        let (view, queue, cfg) = self.pass_input_readonly(now);
        if !queue.iter().any(|p| p.id == id) {
            let spec = job.spec.clone();
            let cfg = &self.config;
            let partition = cfg.partition_name(&spec.partition);
            let why = crate::partitions::blocked_by(cfg, &spec, job.time_limit_secs);
            if let Some(why) = why {
                out.reason = why.reason().into();
                out.summary = why.summary(partition);
                return Ok(Explain::Done(out));
            }
            // Left out of passes: it waits for other jobs.
            let deps = (job.spec.dependencies.iter())
                .map(|d| format!("{:?} {}", d.kind, d.job_id))
                .collect::<Vec<_>>()
                .join(", ");
            out.reason = "Dependency".into();
            out.summary = format!("waits for its dependencies ({deps})");
            return Ok(Explain::Done(out));
        }
        Ok(Explain::Pass(Box::new(PassInput {
            base: out,
            view,
            queue,
            cfg,
        })))
    }
}

/// `out` (an `Explain::Pass`'s base) with what the pass found for the job (`ex`, from
/// `sched::explain` at `now`).
pub fn rendered(mut out: Explanation, ex: &sched::Explanation, now: i64) -> Explanation {
    out.rank = ex.rank as u32;
    out.priority = ex.priority;
    // A job held back by a cap or a floor: the nodes it would fit are free for it,
    // not "fits now".
    let held = matches!(
        &ex.outcome,
        Err(w) if matches!(w.reason, sched::Blocked::Cap(_) | sched::Blocked::WindowFloor { .. })
    );
    out.nodes = ex
        .nodes
        .iter()
        .map(|(n, m)| NodeExplain {
            node: n.clone(),
            reason: match m {
                Some(m) => describe_miss(m),
                None if held => "room for it, but it is held back (see why)".into(),
                None => String::new(),
            },
        })
        .collect();
    match &ex.outcome {
        Ok(start) => {
            out.reason = "None".into();
            out.summary = format!(
                "fits now on {}; it starts at the next pass",
                start
                    .allocs
                    .iter()
                    .map(|a| a.node.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            );
            out.expected_start_ms = now;
        }
        Err(w) => {
            out.reason = w.reason.to_string();
            out.expected_start_ms = w.reservation.as_ref().map_or(0, |r| r.start);
            out.summary = match &w.reason {
                sched::Blocked::Resources => "waits for resources held by running jobs".into(),
                sched::Blocked::Priority { behind } => {
                    format!(
                        "would fit now, but the slots are reserved for higher-priority job {behind}"
                    )
                }
                sched::Blocked::NodesUnavailable => {
                    "only nodes that are down or drained could run it".into()
                }
                sched::Blocked::Infeasible => "no node could ever run it".into(),
                sched::Blocked::BeyondDepth => {
                    "past the reservation depth: starts only when it fits now".into()
                }
                sched::Blocked::Cap(over) => cap_summary(over),
                sched::Blocked::WindowFloor { window } => format!(
                    "starting it would leave less than window {window:?}'s guaranteed GPUs to its account(s) while it runs (windows.{window}.floor); it starts when the floor allows or the window closes"
                ),
            };
            if let Some(r) = &w.reservation {
                out.summary.push_str(&format!(
                    "; reserved on {}",
                    r.allocs
                        .iter()
                        .map(|a| a.node.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                ));
            }
        }
    }
    out
}

/// One line on why a job does not fit a node.
fn describe_miss(m: &sched::Miss) -> String {
    use sched::Miss;
    let gib = |b: u64| bytesize::ByteSize(b).to_string();
    match m {
        Miss::Partition { name } => format!("not in partition {name}"),
        Miss::NotListed => "left out by the job's nodelist or exclude".into(),
        Miss::Features => "lacks the features the job's constraint asks for".into(),
        Miss::Drained => "node drained".into(),
        Miss::Down => "node down".into(),
        Miss::GpuModel { want } if want.is_empty() => "no GPU of a usable kind".into(),
        Miss::GpuModel { want } => format!("GPU model is not {}", want.join(" or ")),
        Miss::TooSmall { what } => format!("not enough {what} even when empty"),
        Miss::NoMigProfile { profile } => format!("no MIG instance of profile {profile}"),
        Miss::Gpus { need, free } => format!("not enough free GPUs (need {need}, free {free})"),
        Miss::Mig {
            profile,
            need,
            free,
        } => {
            format!("not enough free {profile} MIG instances (need {need}, free {free})")
        }
        Miss::GpuShare {
            need_milli,
            need_mib,
            best_free_milli,
            best_free_mib,
        } => format!(
            "no GPU with a free share of {:.0}% and {need_mib} MiB (best: {:.0}% and {best_free_mib} MiB)",
            f64::from(*need_milli) / 10.0,
            f64::from(*best_free_milli) / 10.0
        ),
        Miss::Cpus { need, free } => format!(
            "not enough free CPUs (need {}, free {})",
            f64::from(*need) / 1000.0,
            f64::from(*free) / 1000.0
        ),
        Miss::Memory { need, free } => format!(
            "not enough free memory (need {}, free {})",
            gib(*need),
            gib(*free)
        ),
        Miss::Reserved { job, from } => format!(
            "reserved for job {job} from {}",
            humantime::format_rfc3339_seconds(
                UNIX_EPOCH + Duration::from_millis((*from).max(0) as u64)
            )
        ),
    }
}

/// What a QoS cap a job waits for says.
fn cap_summary(over: &sched::limits::Over) -> String {
    let (who, qos, limit) = match over {
        sched::limits::Over::User { qos, limit_milli } => ("its user", qos, limit_milli),
        sched::limits::Over::Account { qos, limit_milli } => ("its account", qos, limit_milli),
        sched::limits::Over::Array { array, max_running } => {
            return format!(
                "its array {array} already runs {max_running} tasks, the most its %{max_running} allows; it starts when one ends"
            );
        }
    };
    let key = if who == "its user" {
        "max_gpus_per_user"
    } else {
        "max_gpus_per_account"
    };
    format!(
        "starting it would put {who} over the {} GPUs qos {qos:?} allows at once (qos.{qos}.{key}); it starts when their running jobs end",
        *limit as f64 / 1000.0
    )
}
