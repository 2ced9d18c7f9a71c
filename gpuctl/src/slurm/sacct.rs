//! `sacct`: accounting in Slurm's formats: `-o/--format JobID,JobName,State,ExitCode,
//! NodeList,Elapsed,Start,End,...` (`Name%30` widths), `-P/--parsable2` (`|` between
//! fields), `-p/--parsable` (and after the last), `-n`, `-X` (no steps), `-j`, `-S`,
//! `-E`, `-u`, `--json`. A job's steps follow it as `N.batch`, `N.0`, ...

use std::ffi::OsString;

use gpuctl_proto as pb;

use super::{clap_failure, exit_code, hms, limit_hms, state_with_actor, time};
use crate::cli::{Failure, exit, fail, print};
use crate::format;

#[derive(clap::Parser, Debug)]
#[command(name = "sacct")]
pub(super) struct Args {
    /// Only these jobs (`N`, or `N.STEP` for one step).
    #[arg(short = 'j', long = "jobs", value_delimiter = ',')]
    jobs: Vec<String>,
    /// Fields, comma-separated (`Name%30` gives a width).
    #[arg(short = 'o', long = "format", value_delimiter = ',')]
    pub(super) format: Vec<String>,
    /// `|` between fields, none after the last.
    #[arg(short = 'P', long = "parsable2")]
    parsable2: bool,
    /// `|` after every field.
    #[arg(short = 'p', long = "parsable")]
    parsable: bool,
    /// No header.
    #[arg(short = 'n', long = "noheader")]
    noheader: bool,
    /// Jobs only, not their steps.
    #[arg(short = 'X', long = "allocations")]
    pub(super) allocations: bool,
    /// Jobs active at or after this time (default: midnight today; with -j, all).
    #[arg(short = 'S', long = "starttime")]
    start: Option<String>,
    /// Jobs active at or before this time (default: now).
    #[arg(short = 'E', long = "endtime")]
    end: Option<String>,
    /// Only these users' jobs.
    #[arg(short = 'u', long = "user", value_delimiter = ',')]
    users: Vec<String>,
    /// Every user's jobs (Slurm's default is your own).
    #[arg(short = 'a', long = "allusers")]
    all_users: bool,
    /// Only these states.
    #[arg(short = 's', long = "state", value_delimiter = ',')]
    states: Vec<String>,
    /// Only jobs with these names.
    #[arg(long = "name", value_delimiter = ',')]
    names: Vec<String>,
    /// Slurm's JSON (the fields tools read).
    #[arg(long)]
    json: bool,
    /// Accepted: all of a job's records are shown (there is one).
    #[arg(short = 'D', long = "duplicates")]
    _duplicates: bool,
    /// Accepted (one cluster).
    #[arg(short = 'L', long = "allclusters")]
    _all_clusters: bool,
    /// Accepted (one cluster: `all` or its name).
    #[arg(short = 'M', long = "clusters")]
    _clusters: Option<String>,
}

/// sacct's default fields.
const DEFAULT: &[&str] = &[
    "JobID",
    "JobName",
    "Partition",
    "Account",
    "AllocCPUS",
    "State",
    "ExitCode",
];

/// Every field this sacct knows, by Slurm's name (any case), with its default width.
const FIELDS: &[(&str, usize)] = &[
    ("JobID", 12),
    ("JobIDRaw", 12),
    ("JobName", 10),
    ("Partition", 10),
    ("Account", 10),
    ("User", 9),
    ("UID", 6),
    ("AllocCPUS", 10),
    ("NCPUS", 10),
    ("NNodes", 8),
    ("AllocNodes", 10),
    ("State", 10),
    ("ExitCode", 8),
    ("DerivedExitCode", 15),
    ("NodeList", 15),
    ("Elapsed", 10),
    ("ElapsedRaw", 10),
    ("Start", 19),
    ("End", 19),
    ("Submit", 19),
    ("Eligible", 19),
    ("Timelimit", 10),
    ("TimelimitRaw", 12),
    ("QOS", 10),
    ("Reason", 20),
    ("WorkDir", 20),
    ("AllocTRES", 30),
    ("ReqTRES", 30),
    ("Comment", 15),
    ("WCKey", 10),
];

/// One row: a job, or one of its steps.
pub(super) struct Row<'a> {
    job: &'a pb::Job,
    /// `None`: the job itself; `Some(None)`: its batch step; `Some(Some(i))`: step i.
    step: Option<Option<&'a pb::Step>>,
    now: i64,
}

pub async fn run(args: Vec<OsString>) -> Result<u8, Failure> {
    use clap::Parser as _;
    let a = Args::try_parse_from(args).map_err(clap_failure)?;
    let fields = fields(&a.format)?;
    let mut client = super::client().await?;
    let now = format::now_ms();
    let midnight = {
        let z = jiff::Zoned::now();
        z.start_of_day()
            .map_or(now - 86_400_000, |d| d.timestamp().as_millisecond())
    };
    let since = match &a.start {
        Some(s) => when(s, now)?,
        None if !a.jobs.is_empty() => 0,
        None => midnight,
    };
    let until = match &a.end {
        Some(s) => when(s, now)?,
        None => now,
    };
    let mut users = a.users.clone();
    if users.is_empty() && !a.all_users && a.jobs.is_empty() {
        users.push(crate::commands::whoami::run(&mut client).await?.user);
    }
    let req = pb::ListJobsRequest {
        all: true,
        users,
        names: a.names.clone(),
        ..Default::default()
    };
    let wanted: Vec<&str> = a.jobs.iter().map(|j| j.trim()).collect();
    let jobs: Vec<pb::Job> = super::jobs(&mut client, req)
        .await?
        .into_iter()
        .filter(|j| crate::commands::history::in_window(j, since, until))
        .filter(|j| a.states.is_empty() || a.states.iter().any(|s| state_is(s, j)))
        .collect();
    let rows = rows(&jobs, &wanted, a.allocations, now);
    if a.json {
        print(&(json(&rows).to_string() + "\n"));
        return Ok(exit::OK);
    }
    print(&table(&rows, &fields, &a));
    Ok(exit::OK)
}

/// The lines of `jobs` sacct prints: each job `wanted` (all when none is named), then
/// (unless `allocations`, `-X`) its steps: `N.batch` for a script's, `N.0`, ...
pub(super) fn rows<'a>(
    jobs: &'a [pb::Job],
    wanted: &[&str],
    allocations: bool,
    now: i64,
) -> Vec<Row<'a>> {
    let mut rows = Vec::new();
    for j in jobs {
        let id = format::job_id_text(j);
        let job_wanted =
            wanted.is_empty() || wanted.iter().any(|w| *w == id || *w == j.id.to_string());
        let step_wanted = |s: &str| wanted.iter().any(|w| *w == format!("{id}.{s}"));
        if job_wanted {
            rows.push(Row {
                job: j,
                step: None,
                now,
            });
        }
        if allocations {
            continue;
        }
        let script = j
            .spec
            .as_ref()
            .is_some_and(|s| s.command.is_empty() && !s.interactive);
        if script && !j.steps.is_empty() && (job_wanted || step_wanted("batch")) {
            rows.push(Row {
                job: j,
                step: Some(None),
                now,
            });
        }
        for st in &j.steps {
            if job_wanted || step_wanted(&st.id.to_string()) {
                rows.push(Row {
                    job: j,
                    step: Some(Some(st)),
                    now,
                });
            }
        }
    }
    rows
}

fn state_is(s: &str, j: &pb::Job) -> bool {
    let s = s.to_ascii_uppercase();
    s == super::state_long(j) || s == super::state_short(j)
}

/// A time as sacct's `-S`/`-E` take it: gpuctl's forms (`1h` ago, a date, a time),
/// or Slurm's `now`, `now-1hours`, `MM/DD[/YY]`.
fn when(s: &str, now: i64) -> Result<i64, Failure> {
    let t = s.trim().to_ascii_lowercase();
    if t == "now" {
        return Ok(now);
    }
    if let Some(ago) = t.strip_prefix("now-") {
        let d = crate::sbatch::begin_time(&format!("now+{ago}"), &jiff::Zoned::now())
            .map_err(|_| fail(format!("{s:?} is not a time")))?;
        return Ok(now - (d - now));
    }
    if let Some((m, rest)) = t.split_once('/') {
        let (d, y) = rest.split_once('/').unwrap_or((rest, ""));
        let year = match y.parse::<i16>() {
            Ok(y) if y < 100 => 2000 + y,
            Ok(y) => y,
            Err(_) => jiff::Zoned::now().year(),
        };
        let (Ok(m), Ok(d)) = (m.parse::<i8>(), d.parse::<i8>()) else {
            return Err(fail(format!("{s:?} is not a time")));
        };
        let date = jiff::civil::Date::new(year, m, d)
            .map_err(|e| fail(format!("{s:?} is not a date: {e}")))?;
        return date
            .to_zoned(jiff::tz::TimeZone::system())
            .map(|z| z.timestamp().as_millisecond())
            .map_err(|e| fail(format!("{s:?}: {e}")));
    }
    // Slurm's `YYYY-MM-DD[THH:MM[:SS]]`, in this machine's zone.
    let local = |dt: jiff::civil::DateTime| {
        dt.to_zoned(jiff::tz::TimeZone::system())
            .map(|z| z.timestamp().as_millisecond())
            .map_err(|e| fail(format!("{s:?}: {e}")))
    };
    if let Ok(dt) = t.to_ascii_uppercase().parse::<jiff::civil::DateTime>() {
        return local(dt);
    }
    if let Ok(d) = t.parse::<jiff::civil::Date>() {
        return local(d.to_datetime(jiff::civil::time(0, 0, 0, 0)));
    }
    crate::commands::history::parse_when(s, now)
}

/// The fields asked for, each with its width (`Name%30`), by Slurm's own spelling.
pub(super) fn fields(asked: &[String]) -> Result<Vec<(&'static str, usize)>, Failure> {
    if asked.is_empty() {
        return Ok(DEFAULT
            .iter()
            .map(|d| *FIELDS.iter().find(|f| f.0 == *d).expect("a known field"))
            .collect());
    }
    asked
        .iter()
        .map(|f| f.trim())
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (name, width) = f.split_once('%').unwrap_or((f, ""));
            let known = FIELDS
                .iter()
                .find(|k| k.0.eq_ignore_ascii_case(name))
                .ok_or_else(|| fail(format!("invalid field requested: {name:?}")))?;
            let width = if width.is_empty() {
                known.1
            } else {
                width
                    .parse()
                    .map_err(|_| fail(format!("{f:?}: the width is not a number")))?
            };
            Ok((known.0, width))
        })
        .collect()
}

/// The rows as sacct prints them: fixed columns (cut to their width, with `+` where
/// cut) under a header and a line of dashes, or `|`-separated with `-p`/`-P`.
pub(super) fn table(rows: &[Row<'_>], fields: &[(&str, usize)], a: &Args) -> String {
    let parsable = a.parsable || a.parsable2;
    let line = |cells: Vec<String>| -> String {
        if parsable {
            let mut l = cells.join("|");
            if a.parsable && !a.parsable2 {
                l.push('|');
            }
            l
        } else {
            let cells: Vec<String> = cells
                .iter()
                .zip(fields)
                .map(|(c, (_, w))| {
                    let n = c.chars().count();
                    if n > *w {
                        let cut: String = c.chars().take(w.saturating_sub(1)).collect();
                        format!("{cut}+")
                    } else {
                        format!("{c:>w$}")
                    }
                })
                .collect();
            cells.join(" ")
        }
    };
    let mut out = String::new();
    if !a.noheader {
        out.push_str(&line(fields.iter().map(|f| f.0.to_string()).collect()));
        out.push('\n');
        if !parsable {
            let dashes = fields
                .iter()
                .map(|(_, w)| "-".repeat(*w))
                .collect::<Vec<_>>();
            out.push_str(&dashes.join(" "));
            out.push('\n');
        }
    }
    for r in rows {
        out.push_str(&line(fields.iter().map(|(f, _)| cell(r, f)).collect()));
        out.push('\n');
    }
    out
}

/// One field of a row, as sacct writes it.
fn cell(r: &Row<'_>, field: &str) -> String {
    let j = r.job;
    let none = pb::JobSpec::default();
    let spec = j.spec.as_ref().unwrap_or(&none);
    let res = spec.resources.clone().unwrap_or_default();
    let id = format::job_id_text(j);
    let cpus = (res.cpus.max(1) * res.nodes.max(1)).to_string();
    let job_end = if j.end_time_ms > 0 {
        j.end_time_ms
    } else {
        r.now
    };
    // (start, end) of this row, Unix ms; 0: none.
    let (start, end) = match r.step {
        Some(Some(st)) => (st.start_ms, st.end_ms),
        _ => (j.start_time_ms, j.end_time_ms),
    };
    let elapsed = match (start, end) {
        (0, _) => 0,
        (s, 0) if j.state().is_final() => job_end - s,
        (s, 0) => r.now - s,
        (s, e) => e - s,
    };
    let state = match r.step {
        None | Some(None) => state_with_actor(j),
        Some(Some(st)) => match (st.end_ms > 0, st.exit_code) {
            (true, Some(0)) => "COMPLETED".into(),
            (true, _) => "FAILED".into(),
            (false, _) if j.state().is_final() => super::state_long(j).into(),
            (false, _) => "RUNNING".into(),
        },
    };
    match field {
        "JobID" | "JobIDRaw" => match r.step {
            None => id,
            Some(None) => format!("{id}.batch"),
            Some(Some(st)) => format!("{id}.{}", st.id),
        },
        "JobName" => match r.step {
            None => spec.name.clone(),
            Some(None) => "batch".into(),
            Some(Some(st)) => st.name.clone(),
        },
        "Partition" => spec.partition.clone(),
        "Account" => spec.account.clone(),
        "User" => spec.user.clone(),
        "UID" => nix::unistd::User::from_name(&spec.user)
            .ok()
            .flatten()
            .map_or(String::new(), |u| u.uid.to_string()),
        "AllocCPUS" | "NCPUS" => cpus,
        "NNodes" | "AllocNodes" => match r.step {
            Some(Some(st)) => st.nodes.len().max(1).to_string(),
            _ => res.nodes.max(1).to_string(),
        },
        "State" => state,
        "ExitCode" | "DerivedExitCode" => match r.step {
            Some(Some(st)) => st.exit_code.map_or("0:0".into(), |c| {
                if c >= 0 {
                    format!("{c}:0")
                } else {
                    format!("0:{}", -c)
                }
            }),
            _ => exit_code(j),
        },
        "NodeList" => match r.step {
            Some(Some(st)) if !st.nodes.is_empty() => st.nodes.join(","),
            _ if j.node.is_empty() => "None assigned".into(),
            _ => j.node.clone(),
        },
        "Elapsed" => hms(elapsed),
        "ElapsedRaw" => (elapsed / 1000).to_string(),
        "Start" => time(start),
        "End" => time(end),
        "Submit" | "Eligible" => time(j.submit_time_ms),
        "Timelimit" => limit_hms(j.time_limit_secs),
        "TimelimitRaw" => (j.time_limit_secs / 60).to_string(),
        "QOS" => spec.qos.clone(),
        "Comment" => spec.comment.clone(),
        "WCKey" => spec.wckey.clone(),
        "Reason" => {
            if j.reason.is_empty() {
                "None".into()
            } else {
                j.reason.clone()
            }
        }
        "WorkDir" => spec.workdir.clone(),
        "AllocTRES" | "ReqTRES" => {
            let gpus = format::gpu_request(&res);
            let mut t = format!("cpu={cpus},node={}", res.nodes.max(1));
            if res.memory_bytes > 0 {
                t.push_str(&format!(",mem={}M", res.memory_bytes >> 20));
            }
            if !matches!(gpus.as_str(), "-" | "" | "0") {
                t.push_str(&format!(",gres/gpu={gpus}"));
            }
            t
        }
        _ => String::new(),
    }
}

/// Slurm's `sacct --json` layout, for the fields tools read.
fn json(rows: &[Row<'_>]) -> serde_json::Value {
    let jobs: Vec<serde_json::Value> = rows
        .iter()
        .filter(|r| r.step.is_none())
        .map(|r| {
            let j = r.job;
            let spec = j.spec.clone().unwrap_or_default();
            let steps: Vec<serde_json::Value> = rows
                .iter()
                .filter(|s| s.step.is_some() && s.job.id == j.id)
                .map(|s| {
                    serde_json::json!({
                        "step": {"id": cell(s, "JobID"), "name": cell(s, "JobName")},
                        "state": cell(s, "State"),
                        "exit_code": cell(s, "ExitCode"),
                        "nodes": {"range": cell(s, "NodeList")},
                    })
                })
                .collect();
            serde_json::json!({
                "job_id": j.id,
                "name": spec.name,
                "user": spec.user,
                "account": spec.account,
                "partition": spec.partition,
                "qos": spec.qos,
                "state": {"current": [super::state_long(j)], "reason": cell(r, "Reason")},
                "exit_code": {"return_code": {"set": true, "infinite": false, "number": j.exit_code.unwrap_or(0)}},
                "nodes": j.node,
                "time": {
                    "submission": j.submit_time_ms / 1000,
                    "start": j.start_time_ms / 1000,
                    "end": j.end_time_ms / 1000,
                    "elapsed": cell(r, "ElapsedRaw").parse::<i64>().unwrap_or(0),
                    "limit": {"set": true, "infinite": j.time_limit_secs == 0, "number": j.time_limit_secs / 60},
                },
                "steps": steps,
            })
        })
        .collect();
    serde_json::json!({ "jobs": jobs })
}
