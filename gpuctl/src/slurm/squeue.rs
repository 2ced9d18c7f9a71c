//! `squeue`: pending and running jobs in Slurm's formats: `-o/--format` with `%i %t %j
//! %u %M %l %D %R %P %T ...` (widths `%.18i`, `%-10j`), `-O/--Format` with field names,
//! `-h`, and Slurm's filters (`-u`, `--me`, `-t`, `-j`, `-p`, `-n`, `-A`, `-q`).

use std::ffi::OsString;

use gpuctl_proto as pb;

use super::{Piece, clap_failure, pieces, render, state_long, state_short};
use crate::cli::{Failure, exit, fail, print};
use crate::format;

#[derive(clap::Parser, Debug)]
#[command(name = "squeue", disable_help_flag = true)]
pub(super) struct Args {
    /// No header.
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    /// Output format: `%i %t %j %u %M %l %D %R %P %T %a %q %C %b %N %S %V %e %L %Z %o %r %m %F %K %Q %k`.
    #[arg(short = 'o', long = "format")]
    format: Option<String>,
    /// Output fields by name: `JobID,State,Name:30,UserName,...`.
    #[arg(short = 'O', long = "Format")]
    fields: Option<String>,
    /// Only these states (PD, R, CD, CA, F, TO, NF, PR, OOM or long names; `all`).
    #[arg(short = 't', long = "states", value_delimiter = ',')]
    states: Vec<String>,
    /// Only jobs of these users.
    #[arg(short = 'u', long = "user", value_delimiter = ',')]
    users: Vec<String>,
    /// Only your own jobs.
    #[arg(long)]
    me: bool,
    /// Only these jobs.
    #[arg(short = 'j', long = "jobs", value_delimiter = ',')]
    jobs: Vec<String>,
    /// Only these partitions.
    #[arg(short = 'p', long = "partition", value_delimiter = ',')]
    partitions: Vec<String>,
    /// Only jobs with these names.
    #[arg(short = 'n', long = "name", value_delimiter = ',')]
    names: Vec<String>,
    /// Only jobs charged to these accounts.
    #[arg(short = 'A', long = "account", value_delimiter = ',')]
    accounts: Vec<String>,
    /// Only jobs of these QoS.
    #[arg(short = 'q', long = "qos", value_delimiter = ',')]
    qos: Vec<String>,
    /// Slurm's JSON (the fields tools read).
    #[arg(long)]
    json: bool,
    /// Accepted: every job is shown.
    #[arg(short = 'a', long = "all")]
    _all: bool,
    /// Accepted: the default format.
    #[arg(short = 'l', long = "long")]
    _long: bool,
    /// Array tasks one a line (always so here).
    #[arg(short = 'r', long = "array")]
    _array: bool,
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
}

/// squeue's default format.
const DEFAULT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";

pub async fn run(args: Vec<OsString>) -> Result<u8, Failure> {
    use clap::Parser as _;
    let a = Args::try_parse_from(args).map_err(clap_failure)?;
    let mut client = super::client().await?;
    let mut users = a.users.clone();
    if a.me {
        users.push(crate::commands::whoami::run(&mut client).await?.user);
    }
    let all_states = a.states.iter().any(|s| s.eq_ignore_ascii_case("all"));
    let states: Vec<String> = if all_states {
        Vec::new()
    } else {
        a.states.clone()
    };
    let finished = states.iter().any(|s| {
        !matches!(
            s.to_ascii_uppercase().as_str(),
            "PD" | "PENDING" | "R" | "RUNNING"
        )
    });
    let req = pb::ListJobsRequest {
        all: all_states || finished,
        users,
        states: Vec::new(),
        names: a.names.clone(),
        accounts: a.accounts.clone(),
        partitions: a.partitions.clone(),
    };
    let ids = a
        .jobs
        .iter()
        .map(|j| j.trim().to_string())
        .collect::<Vec<_>>();
    let jobs: Vec<pb::Job> = super::jobs(&mut client, req)
        .await?
        .into_iter()
        .filter(|j| states.is_empty() || states.iter().any(|s| state_matches(s, j)))
        .filter(|j| {
            ids.is_empty()
                || ids.contains(&format::job_id_text(j))
                || ids.contains(&j.id.to_string())
        })
        .filter(|j| a.qos.is_empty() || j.spec.as_ref().is_some_and(|s| a.qos.contains(&s.qos)))
        .collect();
    if a.json {
        print(&(json(&jobs).to_string() + "\n"));
        return Ok(exit::OK);
    }
    let now = format::now_ms();
    let text = match &a.fields {
        Some(f) => by_fields(&jobs, f, !a.noheader, now)?,
        None => by_format(
            &jobs,
            a.format.as_deref().unwrap_or(DEFAULT),
            !a.noheader,
            now,
        ),
    };
    print(&text);
    Ok(exit::OK)
}

fn state_matches(s: &str, j: &pb::Job) -> bool {
    let s = s.to_ascii_uppercase();
    s == state_long(j) || s == state_short(j)
}

/// The `-o` table.
pub(super) fn by_format(jobs: &[pb::Job], format: &str, header: bool, now: i64) -> String {
    table(&pieces(format), jobs, header, now)
}

/// The jobs' lines in `ps`, after the header's.
fn table(ps: &[Piece], jobs: &[pb::Job], header: bool, now: i64) -> String {
    let mut out = String::new();
    if header {
        out.push_str(&render(ps, |c| title(c).to_string()));
        out.push('\n');
    }
    for j in jobs {
        out.push_str(&render(ps, |c| value(j, c, now)));
        out.push('\n');
    }
    out
}

/// `-O` names and the letter of each (Slurm's names, any case).
const FIELDS: &[(&str, char)] = &[
    ("jobid", 'i'),
    ("jobarrayid", 'i'),
    ("arrayjobid", 'F'),
    ("arraytaskid", 'K'),
    ("name", 'j'),
    ("username", 'u'),
    ("userid", 'U'),
    ("state", 'T'),
    ("statecompact", 't'),
    ("timeused", 'M'),
    ("timelimit", 'l'),
    ("timeleft", 'L'),
    ("numnodes", 'D'),
    ("numcpus", 'C'),
    ("reasonlist", 'R'),
    ("reason", 'r'),
    ("nodelist", 'N'),
    ("partition", 'P'),
    ("account", 'a'),
    ("qos", 'q'),
    ("starttime", 'S'),
    ("submittime", 'V'),
    ("endtime", 'e'),
    ("workdir", 'Z'),
    ("command", 'o'),
    ("tres-per-node", 'b'),
    ("gres", 'b'),
    ("minmemory", 'm'),
    ("priority", 'Q'),
    ("exitcode", 'X'),
    ("comment", 'k'),
    ("wckey", 'w'),
];

/// The `-O` table: `Name[:[.]width]`, comma-separated (width 20 by default).
pub(super) fn by_fields(
    jobs: &[pb::Job],
    spec: &str,
    header: bool,
    now: i64,
) -> Result<String, Failure> {
    let mut ps = Vec::new();
    for f in spec.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        let (name, width) = f.split_once(':').unwrap_or((f, ""));
        let right = width.starts_with('.');
        let width = width.trim_start_matches('.');
        let width = if width.is_empty() {
            20
        } else {
            width
                .parse()
                .map_err(|_| fail(format!("-O {f:?}: the width is not a number")))?
        };
        let code = FIELDS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, c)| *c)
            .ok_or_else(|| {
                fail(format!(
                    "-O: invalid field {name:?}; known: {}",
                    FIELDS.iter().map(|f| f.0).collect::<Vec<_>>().join(", ")
                ))
            })?;
        // Each field its width, no separator: Slurm's widths include the spacing.
        ps.push(Piece::Field {
            code,
            right,
            width: width.min(1024),
        });
    }
    Ok(table(&ps, jobs, header, now))
}

/// A field's header, as squeue names it.
fn title(c: char) -> &'static str {
    match c {
        'i' | 'A' => "JOBID",
        'F' => "ARRAY_JOB_ID",
        'K' => "ARRAY_TASK_ID",
        'j' => "NAME",
        'u' => "USER",
        'U' => "UID",
        't' => "ST",
        'T' => "STATE",
        'M' => "TIME",
        'l' => "TIME_LIMIT",
        'L' => "TIME_LEFT",
        'D' => "NODES",
        'C' => "CPUS",
        'R' => "NODELIST(REASON)",
        'r' => "REASON",
        'N' => "NODELIST",
        'P' => "PARTITION",
        'a' => "ACCOUNT",
        'q' => "QOS",
        'S' => "START_TIME",
        'V' => "SUBMIT_TIME",
        'e' => "END_TIME",
        'Z' => "WORK_DIR",
        'o' => "COMMAND",
        'b' => "TRES_PER_NODE",
        'm' => "MIN_MEMORY",
        'Q' => "PRIORITY",
        'X' => "EXIT_CODE",
        'k' => "COMMENT",
        'w' => "WCKEY",
        _ => "",
    }
}

/// A field of job `j`, as squeue writes it.
fn value(j: &pb::Job, c: char, now: i64) -> String {
    let none = pb::JobSpec::default();
    let spec = j.spec.as_ref().unwrap_or(&none);
    let res = spec.resources.clone().unwrap_or_default();
    let pending = j.state() == pb::JobState::Pending;
    let or_na = |s: &str| {
        if s.is_empty() {
            "(null)".to_string()
        } else {
            s.to_string()
        }
    };
    match c {
        'i' | 'A' => format::job_id_text(j),
        'F' => spec
            .array_task_id
            .map_or(j.id, |_| spec.array_job_id)
            .to_string(),
        'K' => spec.array_task_id.map_or("N/A".into(), |t| t.to_string()),
        'j' => spec.name.clone(),
        'u' => spec.user.clone(),
        'U' => nix::unistd::User::from_name(&spec.user)
            .ok()
            .flatten()
            .map_or("-".into(), |u| u.uid.to_string()),
        't' => state_short(j).to_string(),
        'T' => state_long(j).to_string(),
        'M' => format::slurm_duration(format::elapsed_ms(j, now)),
        'l' if j.time_limit_secs == 0 => "UNLIMITED".into(),
        'l' => format::slurm_duration(secs_ms(j.time_limit_secs)),
        'L' if j.time_limit_secs == 0 => "UNLIMITED".into(),
        'L' => {
            format::slurm_duration((secs_ms(j.time_limit_secs) - format::elapsed_ms(j, now)).max(0))
        }
        'D' => res.nodes.max(1).to_string(),
        'C' => (res.cpus.max(1) * res.nodes.max(1)).to_string(),
        'R' if pending => format!(
            "({})",
            if j.reason.is_empty() {
                "None"
            } else {
                &j.reason
            }
        ),
        'R' | 'N' => or_na(&j.node),
        'r' => {
            if j.reason.is_empty() {
                "None".into()
            } else {
                j.reason.clone()
            }
        }
        'P' => or_na(&spec.partition),
        'a' => or_na(&spec.account),
        'q' => or_na(&spec.qos),
        'S' if pending && j.expected_start_ms > 0 => super::time(j.expected_start_ms),
        'S' if pending => "N/A".into(),
        'S' => super::time(j.start_time_ms),
        'V' => super::time(j.submit_time_ms),
        'e' if j.end_time_ms > 0 => super::time(j.end_time_ms),
        'e' if j.start_time_ms > 0 && j.time_limit_secs > 0 => {
            super::time(j.start_time_ms + secs_ms(j.time_limit_secs))
        }
        'e' => "N/A".into(),
        'Z' => spec.workdir.clone(),
        'o' if spec.command.is_empty() => "(script)".into(),
        'o' => spec.command.join(" "),
        'b' => match format::gpu_request(&res).as_str() {
            "-" | "" | "0" => "N/A".into(),
            g => format!("gres/gpu:{g}"),
        },
        'm' if res.memory_bytes > 0 => format!("{}M", res.memory_bytes >> 20),
        'm' => "0".into(),
        'Q' => spec.priority.to_string(),
        'X' => super::exit_code(j),
        'k' => or_na(&spec.comment),
        'w' => or_na(&spec.wckey),
        _ => String::new(),
    }
}

fn secs_ms(secs: u64) -> i64 {
    i64::try_from(secs.min(1 << 40)).unwrap_or(0) * 1000
}

/// Slurm's `squeue --json` layout, for the fields tools read: `jobs[]` with `job_id`,
/// `name`, `user_name`, `account`, `partition`, `qos`, `job_state` (a list),
/// `state_reason`, `nodes`, times as `{"set", "infinite", "number"}`, `time_limit` in
/// minutes.
pub fn json(jobs: &[pb::Job]) -> serde_json::Value {
    let num = |n: i64| serde_json::json!({"set": n > 0, "infinite": false, "number": n.max(0)});
    let list: Vec<serde_json::Value> = jobs
        .iter()
        .map(|j| {
            let none = pb::JobSpec::default();
            let s = j.spec.as_ref().unwrap_or(&none);
            let res = s.resources.clone().unwrap_or_default();
            serde_json::json!({
                "job_id": j.id,
                "array_job_id": num(s.array_task_id.map_or(0, |_| s.array_job_id as i64)),
                "array_task_id": num(s.array_task_id.map_or(0, i64::from)),
                "name": s.name,
                "user_name": s.user,
                "account": s.account,
                "partition": s.partition,
                "qos": s.qos,
                "comment": s.comment,
                "wckey": s.wckey,
                "mail_type": if s.mail_type.is_empty() { Vec::new() } else { s.mail_type.split(',').collect::<Vec<_>>() },
                "mail_user": s.mail_user,
                "job_state": [state_long(j)],
                "state_reason": if j.reason.is_empty() { "None" } else { &j.reason },
                "nodes": j.node,
                "node_count": num(i64::from(res.nodes.max(1))),
                "current_working_directory": s.workdir,
                "submit_time": num(j.submit_time_ms / 1000),
                "start_time": num(j.start_time_ms / 1000),
                "end_time": num(j.end_time_ms / 1000),
                "time_limit": num(i64::try_from(j.time_limit_secs / 60).unwrap_or(0)),
                "exit_code": {"return_code": num(i64::from(j.exit_code.unwrap_or(0)))},
            })
        })
        .collect();
    serde_json::json!({ "jobs": list })
}
