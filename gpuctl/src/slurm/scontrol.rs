//! `scontrol`: `show job N` and `show node NAME` in Slurm's `Key=Value` layout (what
//! tools parse), `hold`, `release`, `requeue`, and `update` of a job's `TimeLimit`,
//! `Partition`, `JobName`, `Comment` and `Nice`, or of a node's `State` (DRAIN with a
//! `Reason`, RESUME). Other keys are refused, named.

use std::ffi::OsString;

use gpuctl_proto as pb;

use super::{state_long, time};
use crate::cli::{Failure, exit, fail, print};
use crate::commands::hold::Action;
use crate::format;

pub async fn run(args: Vec<OsString>) -> Result<u8, Failure> {
    let words: Vec<String> = args
        .into_iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .filter(|a| {
            !matches!(
                a.as_str(),
                "-o" | "--oneliner" | "-d" | "--details" | "-a" | "--all"
            )
        })
        .collect();
    let one_line = false;
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    let mut client = super::client().await?;
    match w.as_slice() {
        ["show" | "sh", "job" | "jobs", ids @ ..] => {
            let mut out = String::new();
            let ids = if ids.is_empty() {
                super::jobs(&mut client, pb::ListJobsRequest::default())
                    .await?
                    .iter()
                    .map(|j| j.id.to_string())
                    .collect()
            } else {
                ids.iter().map(|s| s.to_string()).collect::<Vec<_>>()
            };
            for id in ids {
                let id: u64 = id
                    .split(['_', '.'])
                    .next()
                    .and_then(|i| i.parse().ok())
                    .ok_or_else(|| fail(format!("invalid job id specified: {id}")))?;
                let j = client
                    .get_job(pb::GetJobRequest { job_id: id })
                    .await
                    .map_err(|s| {
                        if s.code() == tonic::Code::NotFound {
                            fail("Invalid job id specified")
                        } else {
                            Failure::from(s)
                        }
                    })?
                    .into_inner();
                out.push_str(&show_job(&j, one_line));
                out.push('\n');
            }
            print(&out);
            Ok(exit::OK)
        }
        ["show" | "sh", "node" | "nodes", names @ ..] => {
            let nodes = client
                .list_nodes(pb::ListNodesRequest::default())
                .await?
                .into_inner()
                .nodes;
            let shown: Vec<&pb::Node> = nodes
                .iter()
                .filter(|n| names.is_empty() || names.contains(&n.name.as_str()))
                .collect();
            if shown.is_empty() {
                return Err(fail(format!("Node {} not found", names.join(","))));
            }
            let out: String = shown.iter().map(|n| show_node(n) + "\n").collect();
            print(&out);
            Ok(exit::OK)
        }
        [verb @ ("hold" | "uhold" | "release" | "requeue" | "requeuehold"), ids @ ..] => {
            if ids.is_empty() {
                return Err(fail(format!("{verb}: give job ids")));
            }
            let action = match *verb {
                "hold" | "uhold" => Action::Hold,
                "release" => Action::Release,
                _ => Action::Requeue,
            };
            let targets: Vec<String> = ids.iter().flat_map(|i| i.split(',')).map(str::to_string).collect();
            crate::commands::hold::run(&mut client, action, &targets).await?;
            Ok(exit::OK)
        }
        ["show" | "sh", "config"] => {
            // What tools read of it (MinJobAge: how long squeue still lists a finished
            // job; gpuctl lists finished jobs as long as [retention] keeps them).
            print(
                "Configuration data as of gpuctl\nClusterName = gpuctl\nMinJobAge = 300 sec\nSchedulerType = sched/backfill\nSelectType = select/cons_tres\nGresTypes = gpu\n",
            );
            Ok(exit::OK)
        }
        ["show" | "sh", "partition" | "partitions", names @ ..] => {
            let parts = client
                .partitions(pb::PartitionsRequest {})
                .await?
                .into_inner()
                .partitions;
            let out: String = parts
                .iter()
                .filter(|p| names.is_empty() || names.contains(&p.name.as_str()))
                .map(|p| {
                    key_values(&[
                        format!("PartitionName={}", p.name),
                        format!(
                            "Default={} State={}",
                            if p.is_default { "YES" } else { "NO" },
                            p.state.to_ascii_uppercase()
                        ),
                        format!(
                            "MaxTime={} DefaultTime={}",
                            if p.max_time_secs == 0 { "UNLIMITED".into() } else { super::limit_hms(p.max_time_secs) },
                            if p.default_time_secs == 0 { "NONE".into() } else { super::limit_hms(p.default_time_secs) }
                        ),
                        format!("Nodes={} TotalNodes={}", super::sinfo::hostlist(p.nodes.iter().map(String::as_str)), p.nodes.len()),
                    ]) + "\n"
                })
                .collect();
            print(&out);
            Ok(exit::OK)
        }
        ["update", pairs @ ..] => {
            update(&mut client, pairs).await?;
            Ok(exit::OK)
        }
        _ => Err(Failure {
            code: exit::USAGE,
            message: "gpuctl answers to: scontrol show job [N...], show node [NAME...], hold|release|requeue N..., update JobId=N KEY=VALUE..., update NodeName=NAME State=DRAIN|RESUME [Reason=...]"
                .into(),
        }),
    }
}

/// What `scontrol update` changes here (the keys it knows).
const UPDATE_KEYS: &str = "JobId= with TimeLimit=, Partition=, JobName=, Comment=, Nice[=N]; or NodeName= with State=DRAIN|DOWN|RESUME and Reason=";

/// `scontrol update KEY=VALUE...`: a job's (JobId=) or a node's (NodeName=).
async fn update(client: &mut crate::cli::Client, pairs: &[&str]) -> Result<(), Failure> {
    use crate::commands::update::{NewLimit, Update};
    let mut ids: Vec<u64> = Vec::new();
    let mut node: Option<(String, Option<String>, Option<String>)> = None;
    let mut u = Update::default();
    for pair in pairs {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let bad = |why: &str| fail(format!("scontrol update {pair}: {why}"));
        match key.to_ascii_lowercase().as_str() {
            "jobid" | "job" => {
                for id in value.split(',') {
                    let id = id.split(['_', '.']).next().unwrap_or_default();
                    ids.push(id.parse().map_err(|_| bad("not a job id"))?);
                }
            }
            "timelimit" => u.time = Some(NewLimit::parse(value).map_err(|e| bad(&e))?),
            "partition" => u.partition = Some(value.to_string()),
            "jobname" | "name" => u.name = Some(value.to_string()),
            "comment" => u.comment = Some(value.to_string()),
            // Slurm's `Nice` alone is 100.
            "nice" if value.is_empty() => u.priority = Some(-100),
            "nice" => {
                let n: i32 = value.parse().map_err(|_| bad("not a number"))?;
                u.priority = Some(n.saturating_neg());
            }
            "nodename" | "node" => node.get_or_insert_default().0 = value.to_string(),
            "state" => node.get_or_insert_default().1 = Some(value.to_ascii_uppercase()),
            "reason" => node.get_or_insert_default().2 = Some(value.to_string()),
            _ => {
                return Err(bad(&format!(
                    "not changed by gpuctl (it changes {UPDATE_KEYS})"
                )));
            }
        }
    }
    if let Some((name, state, reason)) = node {
        if !ids.is_empty() {
            return Err(fail("scontrol update: a job or a node, not both"));
        }
        return update_node(client, name, state, reason).await;
    }
    if ids.is_empty() {
        return Err(fail(format!(
            "scontrol update: name the job (JobId=N) or the node (NodeName=NAME): {UPDATE_KEYS}"
        )));
    }
    crate::commands::update::run(client, &ids, &u).await?;
    Ok(())
}

/// `scontrol update NodeName=NAME State=DRAIN|DOWN Reason=...` or `State=RESUME`.
async fn update_node(
    client: &mut crate::cli::Client,
    name: String,
    state: Option<String>,
    reason: Option<String>,
) -> Result<(), Failure> {
    if name.is_empty() {
        return Err(fail("scontrol update: NodeName= names no node"));
    }
    let action = match state.as_deref() {
        Some("DRAIN" | "DOWN" | "FAIL") => {
            let Some(reason) = reason.filter(|r| !r.is_empty()) else {
                return Err(fail(
                    "You must specify a reason when DOWNING or DRAINING a node. Request denied",
                ));
            };
            crate::cli::NodeAction::Drain { name, reason }
        }
        Some("RESUME" | "IDLE" | "UNDRAIN") => crate::cli::NodeAction::Resume { name },
        Some(other) => {
            return Err(fail(format!(
                "scontrol update NodeName: State={other} is not changed by gpuctl (DRAIN, DOWN or RESUME)"
            )));
        }
        None => return Err(fail("scontrol update NodeName: give State=DRAIN|RESUME")),
    };
    crate::commands::node::run(client, action).await?;
    Ok(())
}

/// A job's `Reason=` as scontrol writes it: a pending job's reason (one word), and for
/// an ended one Slurm's name of why it ended (`NonZeroExitCode`, `TimeLimit`, ...).
fn reason(j: &pb::Job) -> String {
    use pb::JobState as S;
    let ended = match j.state() {
        S::Running | S::Completed | S::Cancelled => Some("None"),
        S::Failed if super::state_long(j) == "OUT_OF_MEMORY" => Some("OutOfMemory"),
        S::Failed if j.exit_code.is_some_and(|c| c != 0) => Some("NonZeroExitCode"),
        S::Timeout => Some("TimeLimit"),
        S::NodeFail => Some("NodeDown"),
        S::Preempted => Some("Preempted"),
        _ => None,
    };
    match ended {
        Some(r) => r.to_string(),
        None if j.reason.is_empty() => "None".to_string(),
        None => j.reason.replace(' ', "_"),
    }
}

/// A job as `scontrol show job` writes it.
pub fn show_job(j: &pb::Job, _one_line: bool) -> String {
    let none = pb::JobSpec::default();
    let s = j.spec.as_ref().unwrap_or(&none);
    let res = s.resources.clone().unwrap_or_default();
    let uid = nix::unistd::User::from_name(&s.user).ok().flatten();
    let (uid_n, gid_n) = uid.map_or((0, 0), |u| (u.uid.as_raw(), u.gid.as_raw()));
    let now = format::now_ms();
    let limit = if j.time_limit_secs == 0 {
        "UNLIMITED".to_string()
    } else {
        super::hms(i64::try_from(j.time_limit_secs.min(1 << 40)).unwrap_or(0) * 1000)
    };
    let reason = reason(j);
    let gpus = format::gpu_request(&res);
    let tres = format!(
        "cpu={},mem={}M,node={}{}",
        res.cpus.max(1) * res.nodes.max(1),
        res.memory_bytes >> 20,
        res.nodes.max(1),
        if matches!(gpus.as_str(), "-" | "" | "0") {
            String::new()
        } else {
            format!(",gres/gpu={gpus}")
        }
    );
    let lines = [
        format!("JobId={} JobName={}", j.id, s.name),
        format!("UserId={}({uid_n}) GroupId=({gid_n}) MCS_label=N/A", s.user),
        format!(
            "Priority={} Nice={} Account={} QOS={}",
            s.priority, -s.priority, s.account, s.qos
        ),
        format!(
            "JobState={} Reason={reason} Dependency=(null)",
            state_long(j)
        ),
        format!(
            "Requeue={} Restarts={} BatchFlag={} Reboot=0 ExitCode={}",
            u8::from(s.requeue),
            j.attempt.saturating_sub(1),
            u8::from(s.command.is_empty() && !s.interactive),
            super::exit_code(j)
        ),
        format!(
            "RunTime={} TimeLimit={limit} TimeMin=N/A",
            super::hms(format::elapsed_ms(j, now))
        ),
        format!(
            "SubmitTime={} EligibleTime={}",
            time(j.submit_time_ms),
            time(j.submit_time_ms.max(s.begin_ms))
        ),
        format!(
            "StartTime={} EndTime={} Deadline=N/A",
            time(if j.start_time_ms > 0 {
                j.start_time_ms
            } else {
                j.expected_start_ms
            }),
            time(j.end_time_ms)
        ),
        format!("Partition={} AllocNode:Sid=(null)", s.partition),
        format!(
            "MailUser={} MailType={}",
            if s.mail_user.is_empty() {
                &s.user
            } else {
                &s.mail_user
            },
            if s.mail_type.is_empty() {
                "NONE"
            } else {
                &s.mail_type
            }
        ),
        format!(
            "NodeList={} ExcNodeList={}",
            if j.node.is_empty() { "(null)" } else { &j.node },
            if res.exclude.is_empty() {
                "(null)".into()
            } else {
                res.exclude.join(",")
            }
        ),
        format!(
            "NumNodes={} NumCPUs={} NumTasks={} CPUs/Task={}",
            res.nodes.max(1),
            res.cpus.max(1) * res.nodes.max(1),
            res.tasks_per_node.max(1) * res.nodes.max(1),
            res.cpus.max(1) / res.tasks_per_node.max(1)
        ),
        format!("TRES={tres}"),
        format!(
            "Command={}",
            if s.command.is_empty() {
                "(script)".into()
            } else {
                s.command.join(" ")
            }
        ),
        format!("WorkDir={}", s.workdir),
        format!(
            "StdOut={}",
            if s.stdout.is_empty() {
                format!("{}/gpuctl-{}.out", s.workdir, j.id)
            } else {
                s.stdout.replace("%j", &j.id.to_string())
            }
        ),
    ];
    key_values(&lines)
}

/// A node as `scontrol show node` writes it.
pub(super) fn show_node(n: &pb::Node) -> String {
    let state = match n.state() {
        pb::NodeState::Idle => "IDLE",
        pb::NodeState::Mixed => "MIXED",
        pb::NodeState::Allocated => "ALLOCATED",
        pb::NodeState::Draining => "MIXED+DRAIN",
        pb::NodeState::Drained => "IDLE+DRAIN",
        pb::NodeState::Down | pb::NodeState::Unspecified => "DOWN",
    };
    let model = n
        .gpus
        .first()
        .map_or("gpu".to_string(), |g| g.model.clone());
    let lines = [
        format!("NodeName={} Arch=x86_64 CoresPerSocket=1", n.name),
        format!(
            "CPUAlloc={} CPUTot={} CPULoad=N/A",
            n.cpus_allocated, n.cpus
        ),
        format!(
            "AvailableFeatures={} ActiveFeatures={0}",
            if n.features.is_empty() {
                "(null)".into()
            } else {
                n.features.join(",")
            }
        ),
        format!("Gres=gpu:{model}:{}", n.gpus.len()),
        format!(
            "RealMemory={} AllocMem={} State={state}",
            n.memory_bytes >> 20,
            n.memory_allocated >> 20
        ),
        format!("Partitions={}", n.partitions.join(",")),
        format!("LastBusyTime={}", time(n.last_seen_ms)),
        format!(
            "Reason={}",
            if n.reason.is_empty() {
                "(null)"
            } else {
                &n.reason
            }
        ),
    ];
    key_values(&lines)
}

/// Lines of `Key=Value` as scontrol lays them out: the first flush, the rest indented.
fn key_values(lines: &[String]) -> String {
    let mut out = lines.first().cloned().unwrap_or_default();
    for l in lines.iter().skip(1) {
        out.push_str("\n   ");
        out.push_str(l);
    }
    out.push('\n');
    out
}
