//! How jobs and nodes look to users: JSON objects and tables.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpuctl_proto::{self as pb, JobState, NodeState};
use serde_json::{Value, json};
use tabled::settings::Style;

fn rfc3339(ms: i64) -> Value {
    if ms <= 0 {
        return Value::Null;
    }
    let t = UNIX_EPOCH + Duration::from_millis(ms as u64);
    Value::String(humantime::format_rfc3339_seconds(t).to_string())
}

pub fn state_name(s: JobState) -> &'static str {
    match s {
        JobState::Unspecified => "UNKNOWN",
        other => other.as_str_name(),
    }
}

pub fn node_state_name(s: NodeState) -> &'static str {
    match s {
        NodeState::Unspecified => "UNKNOWN",
        other => other.as_str_name(),
    }
}

/// Milliseconds the job has run (so far, or in all).
pub fn elapsed_ms(j: &pb::Job, now_ms: i64) -> i64 {
    match (j.start_time_ms, j.end_time_ms) {
        (0, _) => 0,
        (s, 0) => (now_ms - s).max(0),
        (s, e) => (e - s).max(0),
    }
}

/// Slurm's elapsed format: M:SS, H:MM:SS or D-HH:MM:SS.
pub fn slurm_duration(ms: i64) -> String {
    let s = ms / 1000;
    let (d, h, m, s) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub fn job_json(j: &pb::Job) -> Value {
    let spec = j.spec.clone().unwrap_or_default();
    let r = spec.resources.unwrap_or_default();
    json!({
        "id": j.id,
        "name": spec.name,
        "user": spec.user,
        "state": state_name(j.state()),
        "node": if j.node.is_empty() { Value::Null } else { Value::String(j.node.clone()) },
        "gpus": j.gpus,
        "reason": j.reason,
        "exit_code": j.exit_code,
        "submit_time": rfc3339(j.submit_time_ms),
        "start_time": rfc3339(j.start_time_ms),
        "end_time": rfc3339(j.end_time_ms),
        "elapsed_secs": elapsed_ms(j, now_ms()) / 1000,
        "time_limit_secs": j.time_limit_secs,
        "priority": spec.priority,
        "command": spec.command,
        "script": if spec.script.is_empty() { Value::Null } else { Value::String(spec.script.clone()) },
        "workdir": spec.workdir,
        "stdout": if spec.stdout.is_empty() { "gpuctl-%j.out".to_string() } else { spec.stdout.clone() },
        "stderr": if spec.stderr.is_empty() { Value::Null } else { Value::String(spec.stderr.clone()) },
        "env": spec.env,
        "resources": {
            "gpus": r.gpus,
            "cpus": r.cpus,
            "memory_bytes": r.memory_bytes,
        },
    })
}

pub fn node_json(n: &pb::Node) -> Value {
    json!({
        "name": n.name,
        "state": node_state_name(n.state()),
        "reason": n.reason,
        "gpus": n.gpus.iter().map(|g| json!({
            "index": g.index,
            "uuid": g.uuid,
            "model": g.model,
            "memory_mib": g.memory_mib,
            "pci_bus_id": g.pci_bus_id,
            "allocated": g.allocated_to != 0,
            "job_id": if g.allocated_to == 0 { Value::Null } else { json!(g.allocated_to) },
        })).collect::<Vec<_>>(),
        "cpus": n.cpus,
        "cpus_allocated": n.cpus_allocated,
        "memory_bytes": n.memory_bytes,
        "memory_allocated": n.memory_allocated,
        "last_seen": rfc3339(n.last_seen_ms),
        "gpu_backend": n.gpu_backend,
    })
}

fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut b = tabled::builder::Builder::default();
    b.push_record(header.iter().map(|s| s.to_string()));
    for r in rows {
        b.push_record(r);
    }
    let mut t = b.build();
    t.with(Style::blank());
    format!("{t}\n")
}

pub fn queue_table(jobs: &[pb::Job]) -> String {
    let now = now_ms();
    let rows = jobs
        .iter()
        .map(|j| {
            let spec = j.spec.clone().unwrap_or_default();
            let gpus = spec.resources.map_or(0, |r| r.gpus);
            vec![
                j.id.to_string(),
                spec.name,
                spec.user,
                state_name(j.state()).to_string(),
                slurm_duration(elapsed_ms(j, now)),
                gpus.to_string(),
                if j.node.is_empty() {
                    "-".into()
                } else {
                    j.node.clone()
                },
                if j.reason.is_empty() {
                    "-".into()
                } else {
                    j.reason.clone()
                },
            ]
        })
        .collect();
    table(
        &[
            "JOBID", "NAME", "USER", "STATE", "TIME", "GPUS", "NODE", "REASON",
        ],
        rows,
    )
}

pub fn nodes_table(nodes: &[pb::Node]) -> String {
    let rows = nodes
        .iter()
        .map(|n| {
            let alloc = n.gpus.iter().filter(|g| g.allocated_to != 0).count();
            let mut models: Vec<String> = Vec::new();
            for g in &n.gpus {
                if !models.contains(&g.model) {
                    models.push(g.model.clone());
                }
            }
            let models = models
                .iter()
                .map(|m| format!("{}x{m}", n.gpus.iter().filter(|g| &g.model == m).count()))
                .collect::<Vec<_>>()
                .join(",");
            vec![
                n.name.clone(),
                node_state_name(n.state()).to_string(),
                format!("{alloc}/{}", n.gpus.len()),
                if models.is_empty() {
                    "-".into()
                } else {
                    models
                },
                format!("{}/{}", n.cpus_allocated, n.cpus),
                if n.reason.is_empty() {
                    "-".into()
                } else {
                    n.reason.clone()
                },
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "STATE",
            "GPUS(A/T)",
            "MODELS",
            "CPUS(A/T)",
            "REASON",
        ],
        rows,
    )
}

pub fn show_job(j: &pb::Job) -> String {
    let spec = j.spec.clone().unwrap_or_default();
    let r = spec.resources.unwrap_or_default();
    let v = job_json(j);
    let s = |k: &str| match &v[k] {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = String::new();
    let mut line = |k: &str, val: String| out.push_str(&format!("{k:>12}: {val}\n"));
    line("JobId", j.id.to_string());
    line("Name", spec.name.clone());
    line("User", spec.user.clone());
    line("State", state_name(j.state()).to_string());
    line(
        "Reason",
        if j.reason.is_empty() {
            "-".into()
        } else {
            j.reason.clone()
        },
    );
    line(
        "ExitCode",
        j.exit_code.map_or("-".into(), |c| c.to_string()),
    );
    line("Priority", spec.priority.to_string());
    line(
        "Node",
        if j.node.is_empty() {
            "-".into()
        } else {
            j.node.clone()
        },
    );
    line(
        "GPUs",
        if j.gpus.is_empty() {
            "-".into()
        } else {
            j.gpus.join(",")
        },
    );
    line(
        "Request",
        format!(
            "gpus={} cpus={} memory={}",
            r.gpus,
            r.cpus,
            if r.memory_bytes == 0 {
                "-".to_string()
            } else {
                bytesize::ByteSize(r.memory_bytes).to_string()
            }
        ),
    );
    line(
        "TimeLimit",
        humantime::format_duration(Duration::from_secs(j.time_limit_secs)).to_string(),
    );
    line("SubmitTime", s("submit_time"));
    line("StartTime", s("start_time"));
    line("EndTime", s("end_time"));
    line("Elapsed", slurm_duration(elapsed_ms(j, now_ms())));
    if spec.command.is_empty() {
        line("Script", format!("{} lines", spec.script.lines().count()));
    } else {
        line("Command", spec.command.join(" "));
    }
    line("WorkDir", spec.workdir.clone());
    line("StdOut", s("stdout"));
    line(
        "StdErr",
        if spec.stderr.is_empty() {
            "(with stdout)".into()
        } else {
            spec.stderr.clone()
        },
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_like_slurm() {
        assert_eq!(slurm_duration(0), "0:00");
        assert_eq!(slurm_duration(65_000), "1:05");
        assert_eq!(slurm_duration(3_600_000 + 61_000), "1:01:01");
        assert_eq!(slurm_duration(90_000_000), "1-01:00:00");
    }

    #[test]
    fn job_json_has_the_documented_fields() {
        let j = pb::Job {
            id: 3,
            state: JobState::Completed as i32,
            exit_code: Some(0),
            submit_time_ms: 1_700_000_000_000,
            start_time_ms: 1_700_000_001_000,
            end_time_ms: 1_700_000_003_000,
            gpus: vec!["GPU-x".into()],
            node: "n1".into(),
            ..pb::Job::default()
        };
        let v = job_json(&j);
        for k in [
            "id",
            "name",
            "user",
            "state",
            "node",
            "gpus",
            "reason",
            "exit_code",
            "submit_time",
            "start_time",
            "end_time",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!(v["state"], "COMPLETED");
        assert_eq!(v["submit_time"], "2023-11-14T22:13:20Z");
        assert_eq!(v["elapsed_secs"], 2);
    }
}
