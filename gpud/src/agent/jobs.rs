//! One job on this node: its record on disk, its launch (off the async threads), its
//! wait, time limit and kill, and the report of its end; adoption after a restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpuctl_proto::{self as pb, JobState};
use prost::Message;
use tokio::sync::mpsc;

use super::{Agent, Control, now_ms};
use crate::launch::{LaunchSpec, resolve_user, terminate};
use crate::monitor::Watched;

/// What the agent keeps on disk for each job it runs (`<state>/jobs/ID.ATTEMPT.json`),
/// so that a restarted agent finds its jobs again.
#[derive(serde::Serialize, serde::Deserialize)]
struct JobRecord {
    job_id: u64,
    attempt: u32,
    /// The shim's pid and its start time (clock ticks), against pid reuse.
    pid: u32,
    start_ticks: u64,
    started_ms: i64,
    cgroup_leaf: String,
    /// The StartJob, protobuf-encoded.
    start: Vec<u8>,
    /// What the agent added to its environment (MPS's pipe and log directories), for
    /// its steps started from outside (`remote`).
    #[serde(default)]
    extra_env: Vec<(String, String)>,
}

fn record_path(state: &std::path::Path, id: u64, attempt: u32, ext: &str) -> PathBuf {
    state.join("jobs").join(format!("{id}.{attempt}.{ext}"))
}

/// The StartJob of a job instance running here, from its record, and what the agent
/// added to its environment.
pub(super) fn start_of(
    state: &std::path::Path,
    id: u64,
    attempt: u32,
) -> std::io::Result<(pb::StartJob, Vec<(String, String)>)> {
    let bytes = std::fs::read(record_path(state, id, attempt, "json"))?;
    let rec: JobRecord = serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
    let start = pb::StartJob::decode(rec.start.as_slice()).map_err(std::io::Error::other)?;
    Ok((start, rec.extra_env))
}

/// Writes `secs` as the time limit in the record of a job instance running here
/// (atomically: an agent restarted in between finds the old record or the new one).
pub(super) fn save_limit(
    state: &std::path::Path,
    id: u64,
    attempt: u32,
    secs: u64,
) -> std::io::Result<()> {
    let path = record_path(state, id, attempt, "json");
    let mut rec: JobRecord =
        serde_json::from_slice(&std::fs::read(&path)?).map_err(std::io::Error::other)?;
    let mut start = pb::StartJob::decode(rec.start.as_slice()).map_err(std::io::Error::other)?;
    start.time_limit_secs = secs;
    rec.start = start.encode_to_vec();
    write_record(&path, &rec)
}

/// Writes a job instance's record through a temporary file and a rename.
fn write_record(path: &std::path::Path, rec: &JobRecord) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&serde_json::to_vec(rec).map_err(std::io::Error::other)?)?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// Where a job's script is written (see `launch::write_script`).
fn script_path(state: &std::path::Path, id: u64, attempt: u32) -> PathBuf {
    state.join("scripts").join(format!("job-{id}.{attempt}.sh"))
}

/// A job found running (or ended) after an agent restart.
pub(super) struct Adopted {
    job: crate::launch::Launched,
    started_ms: i64,
}

/// What a launch on a blocking thread answers: the job with when its process started,
/// and the GPUs whose MPS daemons it holds.
type Launching =
    tokio::task::JoinHandle<(std::io::Result<(crate::launch::Launched, i64)>, Vec<String>)>;

/// How a job's run begins: its launch under way, or an instance from before a restart.
pub(super) enum Begin {
    Launch(Launching),
    Adopted(Box<Adopted>),
}

/// Starts a job's launch on a blocking thread at once, from the command's handler (off
/// the runtime's threads: MPS daemons and the launch itself; nothing a launch touches
/// may stall heartbeats). Spawning the job's task first and launching from there cost a
/// wake-up of that task, 0.1 ms of every launch (p90 0.5 ms).
pub(super) fn launch(agent: &Arc<Agent>, start: &pb::StartJob) -> Begin {
    let (a, s) = (agent.clone(), start.clone());
    Begin::Launch(tokio::task::spawn_blocking(move || {
        let user = s.spec.as_ref().map(|x| x.user.clone()).unwrap_or_default();
        let (held, env) = mps_shares(&a, &s, false);
        (spawn_recorded(&a, &s, &user, &env), held)
    }))
}

/// Jobs an earlier agent process left: running ones are adopted (watched again, with
/// their kill channels registered before the agent registers), ended ones are reported
/// with the status their shim wrote.
pub(super) fn adopt_jobs(agent: &Arc<Agent>, cgroups: &crate::cgroup::Mode, parent: &str) {
    let dir = agent.state_dir.join("jobs");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let rec: JobRecord = match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("unreadable job record {}: {e}", path.display());
                continue;
            }
        };
        let Ok(start) = <pb::StartJob as Message>::decode(rec.start.as_slice()) else {
            tracing::error!("corrupt StartJob in {}", path.display());
            continue;
        };
        let status = record_path(&agent.state_dir, rec.job_id, rec.attempt, "status");
        // Jobs started by an agent before identities used the old default parent.
        let legacy = format!("gpuctl/{}", agent.name);
        let cgroup = cgroups
            .existing(parent, &rec.cgroup_leaf)
            .or_else(|| cgroups.existing(&legacy, &rec.cgroup_leaf));
        // Its device rules live on in its cgroup; the fake backend's accounting needs
        // to know them again.
        if let Some(cg) = cgroup
            .as_ref()
            .filter(|_| agent.launcher.confines_devices())
        {
            let uuids = start.slots.iter().map(|s| s.uuid.clone()).collect();
            crate::devices::grant(&cg.name, uuids);
        }
        let job = crate::launch::Launched::adopt(rec.pid, cgroup, status);
        let (tx, rx) = mpsc::channel(4);
        agent
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((rec.job_id, rec.attempt), tx);
        let running = crate::procfs::alive(rec.pid, rec.start_ticks);
        tracing::info!(
            job = rec.job_id,
            attempt = rec.attempt,
            pid = rec.pid,
            running,
            "found a job from before the agent restarted"
        );
        tokio::spawn(run_job(
            agent.clone(),
            start,
            rx,
            Begin::Adopted(Box::new(Adopted {
                job,
                started_ms: rec.started_ms,
            })),
        ));
    }
}

pub(super) async fn run_job(
    agent: Arc<Agent>,
    start: pb::StartJob,
    mut control: mpsc::Receiver<Control>,
    begin: Begin,
) {
    let id = start.job_id;
    let attempt = start.attempt;
    let ended = |state: JobState, exit_code: Option<i32>, reason: String| pb::JobReport {
        node: agent.name.clone(),
        job_id: id,
        kind: pb::job_report::Kind::Ended as i32,
        state: state as i32,
        exit_code,
        reason,
        time_ms: now_ms(),
        attempt,
        ..Default::default()
    };
    let was_adopted = matches!(begin, Begin::Adopted(_));
    let (spawned, started_ms, mps_held) = match begin {
        Begin::Adopted(a) => (Ok(a.job), a.started_ms, mps_shares(&agent, &start, true).0),
        Begin::Launch(launching) => {
            let (spawned, held) = launching.await.unwrap_or_else(|e| {
                let e = std::io::Error::other(format!("launch panicked: {e}"));
                (Err(e), Vec::new())
            });
            // Its launch time is when the process existed, before its record was
            // written and this task woke up again (about a millisecond).
            match spawned {
                Ok((job, at)) => (Ok(job), at, held),
                Err(e) => (Err(e), now_ms(), held),
            }
        }
    };
    // The end's report, and the job whose empty cgroup is removed once it is sent.
    let (report, leftover) = match spawned {
        Err(e) => {
            tracing::warn!(job = id, "cannot start job: {e}");
            let mut r = ended(JobState::Failed, None, format!("launch failed: {e}"));
            if let Some(fault) = crate::launch::NodeFault::of(&e) {
                // The node stays drained for it until this agent is restarted.
                *agent.launch_fault.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(format!("launch refused: {fault}"));
                r.node_fault = true;
                r.reason = fault.to_string();
            }
            (r, None)
        }
        Ok(mut job) => {
            tracing::info!(job = id, pid = job.id(), gpus = ?start.slots.iter().map(|s| &s.uuid).collect::<Vec<_>>(), cgroup = job.cgroup.is_some(), adopted = was_adopted, "job started");
            agent
                .watched
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    (id, attempt),
                    (
                        Watched {
                            job_id: id,
                            attempt,
                            pgid: job.id().map_or(0, |p| p as i32),
                            slots: start.slots.clone(),
                            cgroup: job.cgroup.clone(),
                            user: start
                                .spec
                                .as_ref()
                                .map(|s| s.user.clone())
                                .unwrap_or_default(),
                        },
                        Duration::from_secs(start.kill_grace_secs),
                    ),
                );
            if !was_adopted {
                drop(agent.report(pb::JobReport {
                    node: agent.name.clone(),
                    job_id: id,
                    kind: pb::job_report::Kind::Started as i32,
                    time_ms: started_ms,
                    attempt,
                    ..pb::JobReport::default()
                }));
            }
            let mut full = Duration::from_secs(start.time_limit_secs.max(1));
            // An adopted job keeps the deadline it had.
            let ran = Duration::from_millis((now_ms() - started_ms).max(0) as u64);
            let began = tokio::time::Instant::now()
                .checked_sub(ran)
                .unwrap_or_else(tokio::time::Instant::now);
            let grace = Duration::from_secs(start.kill_grace_secs);
            let deadline = tokio::time::sleep_until(began + full);
            tokio::pin!(deadline);
            let (status, forced) = loop {
                break tokio::select! {
                    s = job.wait() => (s, None),
                    _ = &mut deadline => {
                        tracing::info!(job = id, "time limit reached; terminating");
                        let s = terminate(&mut job, grace, None).await;
                        (s, Some((JobState::Timeout, format!("time limit {} reached", humantime::format_duration(full)))))
                    }
                    Some(c) = control.recv() => {
                        let k = match c {
                            Control::Kill(k) => k,
                            Control::Limit(limit) => {
                                // From its start: one already passed ends it now.
                                full = limit.max(Duration::from_secs(1));
                                deadline.as_mut().reset(began + full);
                                continue;
                            }
                        };
                        if let (true, Some(sig)) = (k.signal_only, k.signal) {
                            // `scancel -s SIG`: the job hears it and runs on.
                            tracing::info!(job = id, reason = %k.reason, "signalling job");
                            job.signal(sig);
                            continue;
                        }
                        tracing::info!(job = id, reason = %k.reason, "killing job");
                        let s = terminate(&mut job, k.grace, k.signal).await;
                        (s, Some((k.as_state, k.reason)))
                    }
                };
            };
            let forced = forced
                .or_else(|| {
                    job.launch_error()
                        .map(|e| (JobState::Failed, format!("launch failed: {e}")))
                })
                .or_else(|| {
                    job.oom_killed().then(|| {
                        (
                            JobState::Failed,
                            "out of memory: killed at its memory limit".to_string(),
                        )
                    })
                });
            let ended_ms = job.ended_ms();
            let (cpu_time_ms, mem_peak_bytes) = job.usage();
            // Whatever the job left behind goes before its end is reported, off the
            // runtime's threads (a process stuck in the kernel can hold its cgroup for
            // up to a second): its GPUs are free only once nothing of it runs. When
            // nothing is left, as after almost every end, the report goes first and
            // the empty cgroup is removed while it travels.
            let after_report = if job.left_behind() {
                let _ = tokio::task::spawn_blocking(move || job.cleanup()).await;
                None
            } else {
                Some(job)
            };
            let mut r = exit_report(status, forced, ended);
            if let Some(t) = ended_ms.filter(|&t| t > 0) {
                r.time_ms = t;
            }
            r.cpu_time_ms = cpu_time_ms;
            r.mem_peak_bytes = mem_peak_bytes;
            r.steps = crate::steps::read(&crate::steps::path(&agent.state_dir, id, attempt));
            (r, after_report)
        }
    };
    tracing::info!(job = id, state = report.state().as_str_name(), exit_code = ?report.exit_code, "job ended");
    let saved = agent.report(report);
    if let Some(job) = leftover {
        let _ = tokio::task::spawn_blocking(move || job.cleanup()).await;
    }
    finish(&agent, &start, mps_held, saved).await;
}

/// After a job's end is reported: its MPS shares go back, and once the report is in the
/// queue's copy on disk, the job's own records go (a crash before that re-reports the
/// end from the records, which the controller ignores as a repeat).
async fn finish(
    agent: &Arc<Agent>,
    start: &pb::StartJob,
    mps_held: Vec<String>,
    saved: tokio::task::JoinHandle<()>,
) {
    let (id, attempt) = (start.job_id, start.attempt);
    for g in &mps_held {
        agent.mps.release(g);
    }
    let _ = saved.await;
    for ext in ["json", "status"] {
        let _ = std::fs::remove_file(record_path(&agent.state_dir, id, attempt, ext));
    }
    let _ = std::fs::remove_file(script_path(&agent.state_dir, id, attempt));
    let _ = std::fs::remove_file(crate::steps::path(&agent.state_dir, id, attempt));
    agent
        .watched
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(id, attempt));
    agent
        .jobs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(id, attempt));
}

/// The MPS daemons of the GPUs this job holds a share of (MIG instances are isolated
/// already): held again for an adopted job, acquired (with the environment its clients
/// need) for a new one. Returns the GPUs held and that environment.
fn mps_shares(
    agent: &Agent,
    start: &pb::StartJob,
    adopted: bool,
) -> (Vec<String>, Vec<(String, String)>) {
    let shared = start
        .slots
        .iter()
        .filter(|s| s.compute_milli < 1000 && !s.uuid.starts_with("MIG-"))
        .map(|s| s.uuid.clone());
    let mut held = Vec::new();
    let mut env = Vec::new();
    for g in shared {
        if adopted {
            agent.mps.hold(&g);
            held.push(g);
            continue;
        }
        match agent.mps.acquire(&g) {
            Ok(e) => {
                env.extend(e);
                held.push(g);
            }
            Err(why) => agent.warn(start.job_id, start.attempt, &why),
        }
    }
    (held, env)
}

/// Starts a job under the shim and records it on disk; answers it with when its process
/// was started (Unix ms).
fn spawn_recorded(
    agent: &Arc<Agent>,
    start: &pb::StartJob,
    user: &str,
    extra_env: &[(String, String)],
) -> std::io::Result<(crate::launch::Launched, i64)> {
    // Whom the node runs jobs as is the node's to know: a refusal here is its own.
    let run_as = resolve_user(user, agent.allow_root_jobs)
        .map_err(|e| std::io::Error::other(crate::launch::NodeFault(e)))?;
    let mut spec =
        LaunchSpec::from_start(start, &agent.name, &agent.state_dir.join("scripts"), run_as)?
            .with_tools(agent.tools.as_deref())?;
    spec.env.extend(extra_env.iter().cloned());
    spec.devices = Some(crate::devices::DeviceRules::for_slots(
        &agent.gpus.lock().unwrap_or_else(|p| p.into_inner()),
        start.slots.iter().map(|s| s.uuid.as_str()),
        agent.caps.as_ref(),
    ));
    let jobs = agent.state_dir.join("jobs");
    std::fs::create_dir_all(&jobs)?;
    {
        use std::os::unix::fs::PermissionsExt;
        // Job records hold the StartJob with its env: root's alone.
        std::fs::set_permissions(&jobs, std::fs::Permissions::from_mode(0o700))?;
    }
    // Where its `srun`s record its steps (a script's, or a command's tasks; a step
    // opened from outside makes it then: `remote`).
    if spec.script.is_some() || spec.tasks_per_node > 1 {
        let steps = crate::steps::path(&agent.state_dir, start.job_id, start.attempt);
        let owner = spec.run_as.as_ref().map(|u| (u.uid, u.gid));
        crate::steps::create(&steps, owner)?;
        spec.env
            .insert("GPUCTL_STEPS_FILE".into(), steps.display().to_string());
    }
    let status = record_path(&agent.state_dir, start.job_id, start.attempt, "status");
    let _ = std::fs::remove_file(&status);
    spec.status_file = Some(status);
    let job = agent.launcher.spawn(&spec)?;
    let started_ms = job.launched_ms().unwrap_or_else(now_ms);
    let pid = job.id().unwrap_or(0);
    let rec = JobRecord {
        job_id: start.job_id,
        attempt: start.attempt,
        pid,
        start_ticks: crate::procfs::proc_start(pid).map_or(0, |x| x.1),
        started_ms,
        cgroup_leaf: spec.cgroup_leaf(),
        start: start.encode_to_vec(),
        extra_env: extra_env.to_vec(),
    };
    let path = record_path(&agent.state_dir, start.job_id, start.attempt, "json");
    write_record(&path, &rec)?;
    Ok((job, started_ms))
}

fn exit_report(
    status: std::io::Result<std::process::ExitStatus>,
    forced: Option<(JobState, String)>,
    ended: impl Fn(JobState, Option<i32>, String) -> pb::JobReport,
) -> pb::JobReport {
    use std::os::unix::process::ExitStatusExt;
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            return ended(
                JobState::Failed,
                None,
                format!("cannot wait for the job: {e}"),
            );
        }
    };
    let code = status.code().or_else(|| status.signal().map(|s| 128 + s));
    if let Some((state, reason)) = forced {
        // A released allocation's holder was stopped: it ended as asked, with 0.
        let code = if state == JobState::Completed {
            Some(0)
        } else {
            code
        };
        return ended(state, code, reason);
    }
    match (status.code(), status.signal()) {
        (Some(0), _) => ended(JobState::Completed, Some(0), String::new()),
        (Some(c), _) => ended(JobState::Failed, Some(c), format!("exit code {c}")),
        (None, Some(sig)) => {
            let name = nix::sys::signal::Signal::try_from(sig)
                .map_or_else(|_| sig.to_string(), |s| s.as_str().to_string());
            ended(JobState::Failed, code, format!("killed by signal {name}"))
        }
        (None, None) => ended(JobState::Failed, None, "unknown exit status".into()),
    }
}
