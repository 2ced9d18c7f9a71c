//! `gpuctl history` (like `sacct`): one row per job (and per array task) over a time
//! window, finished ones included, with what each used. It reads the controller's job
//! records (finished jobs are kept as `[retention]` says, across restarts).

use std::time::{Duration, UNIX_EPOCH};

use gpuctl_core::usage;
use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use super::queue::parse_state;
use crate::cli::{Client, Failure, fail};
use crate::format;

#[derive(Debug, Clone, clap::Args)]
#[command(disable_help_flag = true)]
pub struct HistoryArgs {
    /// Jobs active at or after this time: a duration ago (`1h`, `7d`), a date
    /// (`2026-12-01`, UTC) or a time (`2026-12-01T08:00:00`, UTC). Default: 1 day ago.
    #[arg(short = 'S', long)]
    pub since: Option<String>,
    /// Jobs submitted at or before this time (same forms). Default: now.
    #[arg(short = 'E', long)]
    pub until: Option<String>,
    /// Only jobs of these users (comma-separated).
    #[arg(short = 'u', long = "user", value_delimiter = ',')]
    pub users: Vec<String>,
    /// Only jobs charged to these accounts.
    #[arg(short = 'A', long = "account", value_delimiter = ',')]
    pub accounts: Vec<String>,
    /// Only jobs in these states (as `queue -t` takes them).
    #[arg(short = 's', long = "state", value_delimiter = ',')]
    pub states: Vec<String>,
    /// Only jobs with these names.
    #[arg(long = "name", value_delimiter = ',')]
    pub names: Vec<String>,
    /// The columns, comma-separated, from: jobid, name, user, account, partition, qos,
    /// state, submit, start, end, elapsed, time_limit, gpus, node, exit_code, reason,
    /// attempt, gpu_util, gpu_mem_peak, cpu_eff, energy.
    #[arg(short = 'o', long = "format", value_delimiter = ',')]
    pub format: Vec<String>,
    /// A JSON array of rows (every field).
    #[arg(long)]
    pub json: bool,
    /// CSV with a header line (every field, or the `-o` columns).
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// No header line.
    #[arg(short = 'n', long = "noheader")]
    pub noheader: bool,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
}

pub const COLUMNS: &[&str] = &[
    "jobid",
    "name",
    "user",
    "account",
    "partition",
    "qos",
    "state",
    "submit",
    "start",
    "end",
    "elapsed",
    "time_limit",
    "gpus",
    "node",
    "exit_code",
    "reason",
    "attempt",
    "gpu_util",
    "gpu_mem_peak",
    "cpu_eff",
    "energy",
];

const DEFAULT_COLUMNS: &[&str] = &[
    "jobid",
    "name",
    "user",
    "account",
    "state",
    "start",
    "elapsed",
    "gpus",
    "gpu_util",
    "gpu_mem_peak",
    "exit_code",
];

/// One job's accounting record (fields in the order of `COLUMNS`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    pub job_id: String,
    pub array_job_id: Option<u64>,
    pub array_task_id: Option<u32>,
    pub name: String,
    pub user: String,
    pub account: String,
    pub partition: String,
    pub qos: String,
    pub state: String,
    pub submit_time: Option<String>,
    pub start_time: Option<String>,
    pub end_time: Option<String>,
    pub elapsed_secs: u64,
    pub time_limit_secs: u64,
    pub gpus: String,
    pub node: String,
    pub exit_code: Option<i32>,
    pub reason: String,
    pub attempt: u32,
    /// Mean GPU utilisation against the share, percent.
    pub gpu_util_mean: Option<f64>,
    pub gpu_memory_peak_mib: Option<u64>,
    /// CPU time over (elapsed x CPUs asked x nodes), percent.
    pub cpu_efficiency: Option<f64>,
    pub gpu_energy_j: Option<f64>,
    /// The times as Unix ms, for the table's cells.
    #[serde(skip)]
    times_ms: [i64; 3],
}

impl Row {
    fn of(j: &pb::Job, now: i64) -> Row {
        let none = pb::JobSpec::default();
        let spec = j.spec.as_ref().unwrap_or(&none);
        let res = spec.resources.clone().unwrap_or_default();
        let elapsed = format::elapsed_ms(j, now);
        let used = j.usage.clone().map(gpuctl_core::record::JobUsage::from);
        let u = used.as_ref();
        let sampled = u.is_some_and(|u| u.slots.iter().any(|s| s.samples > 0));
        let cpus = if res.cpu_milli > 0 {
            f64::from(res.cpu_milli) / 1000.0
        } else {
            f64::from(res.cpus.max(1))
        } * f64::from(res.nodes.max(1));
        Row {
            job_id: format::job_id_text(j),
            array_job_id: spec.array_task_id.map(|_| spec.array_job_id),
            array_task_id: spec.array_task_id,
            name: spec.name.clone(),
            user: spec.user.clone(),
            account: spec.account.clone(),
            partition: spec.partition.clone(),
            qos: spec.qos.clone(),
            state: format::state_name(j.state()).to_string(),
            submit_time: format::time_string(j.submit_time_ms),
            start_time: format::time_string(j.start_time_ms),
            end_time: format::time_string(j.end_time_ms),
            elapsed_secs: (elapsed / 1000) as u64,
            time_limit_secs: j.time_limit_secs,
            gpus: format::gpu_request(&res),
            node: j.node.clone(),
            exit_code: j.exit_code,
            reason: j.reason.clone(),
            attempt: j.attempt,
            gpu_util_mean: u.and_then(usage::util_mean),
            gpu_memory_peak_mib: u.filter(|_| sampled).map(usage::mem_peak),
            cpu_efficiency: u
                .filter(|u| u.host_reports > 0 && elapsed > 0)
                .map(|u| u.cpu_time_ms as f64 * 100.0 / (elapsed as f64 * cpus)),
            gpu_energy_j: u
                .filter(|_| sampled)
                .map(|u| u.slots.iter().map(|s| s.energy_j).sum()),
            times_ms: [j.submit_time_ms, j.start_time_ms, j.end_time_ms],
        }
    }

    /// A job with steps: its rows after its own, as sacct's: `ID.batch` (a script's
    /// run), then a row for each step (`ID.0`, `ID.1`: each `srun` of the script) with
    /// its command, times, nodes, tasks and their worst exit code; a step whose end was
    /// never recorded (its job was ended under it) shows the job's end state.
    fn steps_of(j: &pb::Job, now: i64) -> Vec<Row> {
        if j.steps.is_empty() {
            return Vec::new();
        }
        // A script job has no command (a finished job's record keeps no script text);
        // an allocation (gpuctl alloc) has neither, and no batch step.
        let script = j
            .spec
            .as_ref()
            .is_some_and(|s| s.command.is_empty() && !s.interactive);
        let job = Row::of(j, now);
        let mut rows = Vec::new();
        if script {
            rows.push(Row {
                job_id: format!("{}.batch", job.job_id),
                name: "batch".into(),
                gpus: "-".into(),
                gpu_util_mean: None,
                gpu_memory_peak_mib: None,
                cpu_efficiency: None,
                gpu_energy_j: None,
                ..job.clone()
            });
        }
        let final_state = j.state().is_final();
        for st in &j.steps {
            let end = (st.end_ms > 0).then_some(st.end_ms);
            let state = match (end, st.exit_code) {
                (Some(_), Some(0)) => "COMPLETED".to_string(),
                (Some(_), Some(_)) => "FAILED".to_string(),
                _ if final_state => format::state_name(j.state()).to_string(),
                _ => "RUNNING".to_string(),
            };
            let until = end.unwrap_or(if final_state { j.end_time_ms } else { now });
            rows.push(Row {
                job_id: format!("{}.{}", job.job_id, st.id),
                name: st.name.clone(),
                state,
                submit_time: format::time_string(st.start_ms),
                start_time: format::time_string(st.start_ms),
                end_time: end.and_then(format::time_string),
                elapsed_secs: ((until - st.start_ms).max(0) / 1000) as u64,
                gpus: "-".into(),
                node: st.nodes.join(","),
                exit_code: st.exit_code,
                reason: format!("{} task{}", st.tasks, if st.tasks == 1 { "" } else { "s" }),
                gpu_util_mean: None,
                gpu_memory_peak_mib: None,
                cpu_efficiency: None,
                gpu_energy_j: None,
                times_ms: [st.start_ms, st.start_ms, end.unwrap_or(0)],
                ..job.clone()
            });
        }
        rows
    }

    /// One cell; `exact`: times with their milliseconds, as RFC 3339 (CSV), else to the
    /// second (tables).
    fn cell(&self, col: &str, exact: bool) -> String {
        let dash = |s: &str| {
            if s.is_empty() {
                "-".to_string()
            } else {
                s.to_string()
            }
        };
        let time = |k: usize| match format::time_string(self.times_ms[k]) {
            None => "-".to_string(),
            Some(t) if exact => t,
            Some(_) => format::short_time(self.times_ms[k]),
        };
        let secs =
            |s: u64| format::slurm_duration(i64::try_from(s).unwrap_or(i64::MAX / 1000) * 1000);
        match col {
            "jobid" => self.job_id.clone(),
            "name" => format::printable(&self.name).into_owned(),
            "user" => self.user.clone(),
            "account" => dash(&self.account),
            "partition" => dash(&self.partition),
            "qos" => dash(&self.qos),
            "state" => self.state.clone(),
            "submit" => time(0),
            "start" => time(1),
            "end" => time(2),
            "elapsed" => secs(self.elapsed_secs),
            "time_limit" => secs(self.time_limit_secs),
            "gpus" => self.gpus.clone(),
            "node" => dash(&self.node),
            "exit_code" => self.exit_code.map_or("-".into(), |c| c.to_string()),
            "reason" => format::printable(&dash(&self.reason)).into_owned(),
            "attempt" => self.attempt.to_string(),
            "gpu_util" => self
                .gpu_util_mean
                .map_or("-".into(), |v| format!("{v:.1}%")),
            "gpu_mem_peak" => self
                .gpu_memory_peak_mib
                .map_or("-".into(), |m| format!("{m}MiB")),
            "cpu_eff" => self
                .cpu_efficiency
                .map_or("-".into(), |v| format!("{v:.1}%")),
            "energy" => self
                .gpu_energy_j
                .map_or("-".into(), |j| format!("{:.3}kWh", j / 3.6e6)),
            _ => String::new(),
        }
    }
}

pub struct History {
    rows: Vec<Row>,
    columns: Vec<String>,
    header: bool,
    csv: bool,
}

impl Serialize for History {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        self.rows.serialize(ser)
    }
}

impl View for History {
    fn text(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| self.columns.iter().map(|c| r.cell(c, self.csv)).collect())
            .collect();
        if self.csv {
            let mut w = csv::Writer::from_writer(Vec::new());
            if self.header {
                let _ = w.write_record(&self.columns);
            }
            for r in &rows {
                let _ = w.write_record(r);
            }
            let bytes = w.into_inner().unwrap_or_default();
            return String::from_utf8_lossy(&bytes).trim_end().to_string();
        }
        let upper: Vec<String> = self.columns.iter().map(|c| c.to_uppercase()).collect();
        let header: Vec<&str> = upper.iter().map(String::as_str).collect();
        let table = format::table(&header, rows);
        if self.header {
            table
        } else {
            table.lines().skip(1).collect::<Vec<_>>().join("\n")
        }
    }
}

/// A time as `--since`/`--until` take it, in Unix ms: a duration ago, a date or a
/// date and time (UTC).
pub fn parse_when(s: &str, now: i64) -> Result<i64, Failure> {
    let s = s.trim();
    if let Ok(d) = humantime::parse_duration(s) {
        return Ok(now.saturating_sub(d.as_millis().min(i64::MAX as u128) as i64));
    }
    let full = if s.len() == 10 {
        format!("{s}T00:00:00Z")
    } else if s.ends_with('Z') {
        s.to_string()
    } else {
        format!("{s}Z")
    };
    let t = humantime::parse_rfc3339_weak(&full).map_err(|_| {
        fail(format!(
            "{s:?} is not a time: give a duration ago (1h, 7d), a date (2026-12-01) or a date and time (2026-12-01T08:00:00), in UTC"
        ))
    })?;
    Ok(t.duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as i64)
}

/// Whether a job belongs to the window [since, until]: it was still active at `since`
/// (or is now) and was submitted by `until`.
pub fn in_window(j: &pb::Job, since: i64, until: i64) -> bool {
    (j.end_time_ms == 0 || j.end_time_ms >= since) && j.submit_time_ms <= until
}

pub async fn run(client: &mut Client, args: &HistoryArgs) -> Result<History, Failure> {
    let now = format::now_ms();
    let since = match &args.since {
        Some(s) => parse_when(s, now)?,
        None => now - 86_400_000,
    };
    let until = match &args.until {
        Some(s) => parse_when(s, now)?,
        None => now,
    };
    let columns: Vec<String> = if args.format.is_empty() {
        DEFAULT_COLUMNS.iter().map(|c| c.to_string()).collect()
    } else {
        let cols: Vec<String> = args
            .format
            .iter()
            .map(|c| c.trim().to_lowercase())
            .collect();
        if let Some(bad) = cols.iter().find(|c| !COLUMNS.contains(&c.as_str())) {
            return Err(fail(format!(
                "unknown column {bad:?}; known: {}",
                COLUMNS.join(", ")
            )));
        }
        cols
    };
    let states = args
        .states
        .iter()
        .map(|s| parse_state(s).map(|s| s as i32))
        .collect::<Result<Vec<_>, _>>()?;
    let req = pb::ListJobsRequest {
        all: true,
        users: args.users.clone(),
        states,
        names: args.names.clone(),
        accounts: args.accounts.clone(),
        partitions: Vec::new(),
    };
    let mut pages = client.list_jobs_paged(req).await?.into_inner();
    let mut rows = Vec::new();
    while let Some(page) = pages.message().await? {
        rows.extend(
            page.jobs
                .iter()
                .filter(|j| in_window(j, since, until))
                .flat_map(|j| std::iter::once(Row::of(j, now)).chain(Row::steps_of(j, now))),
        );
    }
    Ok(History {
        rows,
        columns,
        header: !args.noheader,
        csv: args.csv,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_durations_dates_and_times() {
        let now = 1_800_000_000_000;
        assert_eq!(parse_when("1h", now).ok(), Some(now - 3_600_000));
        assert_eq!(parse_when("7d", now).ok(), Some(now - 7 * 86_400_000));
        assert_eq!(parse_when("2026-12-01", now).ok(), Some(1_796_083_200_000));
        assert_eq!(
            parse_when("2026-12-01T08:00:00", now).ok(),
            Some(1_796_083_200_000 + 8 * 3_600_000)
        );
        assert!(parse_when("yesterday-ish", now).is_err());
    }

    /// A cancelled script job whose second step never recorded its end: `.batch`, a
    /// completed step, and one that shows the job's end; a job without steps has none.
    #[test]
    fn steps_follow_their_job() {
        let step = |id, end, exit| pb::Step {
            id,
            name: format!("step{id}"),
            start_ms: 1_000,
            end_ms: end,
            exit_code: exit,
            tasks: 2,
            nodes: vec!["n1".into()],
        };
        let mut j = pb::Job {
            id: 9,
            state: pb::JobState::Cancelled as i32,
            start_time_ms: 500,
            end_time_ms: 9_000,
            spec: Some(pb::JobSpec::default()),
            steps: vec![step(0, 3_000, Some(0)), step(1, 0, None)],
            ..Default::default()
        };
        let rows = Row::steps_of(&j, 10_000);
        let ids: Vec<&str> = rows.iter().map(|r| r.job_id.as_str()).collect();
        assert_eq!(ids, ["9.batch", "9.0", "9.1"]);
        assert_eq!(
            (rows[1].state.as_str(), rows[1].elapsed_secs),
            ("COMPLETED", 2)
        );
        assert_eq!(
            (rows[2].state.as_str(), rows[2].elapsed_secs),
            ("CANCELLED", 8)
        );
        assert_eq!(rows[2].end_time, None);
        j.steps.clear();
        assert!(Row::steps_of(&j, 10_000).is_empty());
    }

    #[test]
    fn the_window_takes_jobs_active_in_it() {
        let job = |submit, end| pb::Job {
            submit_time_ms: submit,
            end_time_ms: end,
            state: if end > 0 {
                pb::JobState::Completed
            } else {
                pb::JobState::Running
            } as i32,
            ..Default::default()
        };
        assert!(in_window(&job(10, 0), 50, 100));
        assert!(in_window(&job(10, 60), 50, 100));
        assert!(!in_window(&job(10, 40), 50, 100));
        assert!(!in_window(&job(110, 0), 50, 100));
    }
}
