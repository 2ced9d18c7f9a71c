//! How jobs and nodes look to users: JSON objects and tables.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpuctl_proto::{self as pb, JobState, NodeState};
use gpuctl_sched::GpuRequest;
use serde_json::{Value, json};
use tabled::settings::Style;

/// The last instant RFC 3339 can write (9999-12-31T23:59:59Z), in Unix ms.
const MAX_RFC3339_MS: i64 = 253_402_300_799_000;

/// A Unix-ms time as RFC 3339 with milliseconds (`2026-12-02T03:31:35.123Z`: the JSON
/// of jobs and history); `None` for "not yet" (0 or less). Times past year 9999 (which no
/// formatter writes) show as the last one it can.
pub fn time_string(ms: i64) -> Option<String> {
    rfc3339_ms(ms).map(|t| t.to_string())
}

/// A job's time (Unix ms; 0 or less: none) as RFC 3339 with milliseconds, unwritten.
fn rfc3339_ms(ms: i64) -> Option<humantime::Rfc3339Timestamp> {
    (ms > 0).then(|| {
        let t = UNIX_EPOCH + Duration::from_millis(ms.min(MAX_RFC3339_MS) as u64);
        humantime::format_rfc3339_millis(t)
    })
}

fn rfc3339(ms: i64) -> Value {
    time_string(ms).map_or(Value::Null, Value::String)
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
    serde_json::to_value(JobJson::new(j)).expect("job JSON serializes")
}

/// A job as the documented JSON object, serialized straight from the protobuf message
/// (no intermediate `Value`: `queue --json` of 100,000 jobs streams). `gpuctl show`
/// adds the running job's GPU use.
pub struct JobJson<'a> {
    job: &'a pb::Job,
    gpu_use: Option<&'a [crate::commands::show::GpuUse]>,
    /// The time `elapsed_secs` of a running job is counted to (Unix ms).
    now: i64,
}

impl<'a> JobJson<'a> {
    pub fn new(job: &'a pb::Job) -> JobJson<'a> {
        JobJson::at(job, now_ms())
    }

    /// The job with a running job's elapsed time counted to `now` (one clock read for
    /// a whole listing).
    pub fn at(job: &'a pb::Job, now: i64) -> JobJson<'a> {
        JobJson {
            job,
            gpu_use: None,
            now,
        }
    }

    pub fn with_gpu_use(
        job: &'a pb::Job,
        gpu_use: &'a [crate::commands::show::GpuUse],
    ) -> JobJson<'a> {
        JobJson {
            job,
            gpu_use: Some(gpu_use),
            now: now_ms(),
        }
    }
}

/// A time as `time_string` has it, written without a `String` of its own.
struct TimeJson(i64);

impl serde::Serialize for TimeJson {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        match rfc3339_ms(self.0) {
            Some(t) => ser.collect_str(&t),
            None => ser.serialize_none(),
        }
    }
}

fn time_str(ms: i64) -> TimeJson {
    TimeJson(ms)
}

fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// A job's steps (`srun`s of its script): id, name, times, exit code, tasks, nodes.
struct StepsJson<'a>(&'a [pb::Step]);

impl serde::Serialize for StepsJson<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        let mut seq = ser.serialize_seq(Some(self.0.len()))?;
        for st in self.0 {
            struct One<'a>(&'a pb::Step);
            impl serde::Serialize for One<'_> {
                fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
                    let st = self.0;
                    let mut m = ser.serialize_map(Some(7))?;
                    m.serialize_entry("id", &st.id)?;
                    m.serialize_entry("name", &st.name)?;
                    m.serialize_entry("start_time", &time_str(st.start_ms))?;
                    m.serialize_entry("end_time", &time_str(st.end_ms))?;
                    m.serialize_entry("exit_code", &st.exit_code)?;
                    m.serialize_entry("tasks", &st.tasks)?;
                    m.serialize_entry("nodes", &st.nodes)?;
                    m.end()
                }
            }
            seq.serialize_element(&One(st))?;
        }
        seq.end()
    }
}

struct AllocJson<'a>(&'a pb::Allocation);

impl serde::Serialize for AllocJson<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let a = self.0;
        let mut m = ser.serialize_map(Some(8))?;
        m.serialize_entry("node", &a.node)?;
        m.serialize_entry("rank", &a.rank)?;
        m.serialize_entry("slots", &a.slots.iter().map(SlotJson).collect::<Vec<_>>())?;
        m.serialize_entry("cpu_milli", &a.cpu_milli)?;
        m.serialize_entry("memory_bytes", &a.memory_bytes)?;
        m.serialize_entry("ended", &a.ended)?;
        m.serialize_entry("state", &a.ended.then(|| state_name(a.state())))?;
        m.serialize_entry("exit_code", &a.exit_code)?;
        m.end()
    }
}

#[derive(serde::Serialize)]
struct DepJson {
    kind: &'static str,
    job_id: u64,
}

/// `afterok`, `afterany`, `afternotok`, `singleton` (the job file's words) for a
/// dependency kind's wire number.
pub fn dependency_kind(kind: i32) -> &'static str {
    gpuctl_proto::record::dependency_kind(kind).slurm_name()
}

struct SlotJson<'a>(&'a pb::SlotUse);

impl serde::Serialize for SlotJson<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = ser.serialize_map(Some(3))?;
        m.serialize_entry("uuid", &self.0.uuid)?;
        m.serialize_entry("compute_milli", &self.0.compute_milli)?;
        m.serialize_entry("memory_mib", &self.0.memory_mib)?;
        m.end()
    }
}

struct ResourcesJson<'a>(&'a pb::Resources);

impl serde::Serialize for ResourcesJson<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let r = self.0;
        let (mut gpus, mut milli, mut mib, mut mig, mut mig_count) = (0, 0, 0, None, 0);
        match gpu_of(r) {
            GpuRequest::None => {}
            GpuRequest::Whole { count } => gpus = count,
            GpuRequest::Share {
                compute_milli,
                memory_mib,
            } => {
                milli = compute_milli.unwrap_or(0);
                mib = memory_mib.unwrap_or(0);
            }
            GpuRequest::Mig { profile, count } => {
                mig = Some(profile);
                mig_count = count;
            }
        }
        let mut m = ser.serialize_map(None)?;
        m.serialize_entry("gpus", &gpus)?;
        m.serialize_entry("gpu_milli", &milli)?;
        m.serialize_entry("gpu_memory_mib", &mib)?;
        m.serialize_entry("gpu_models", &r.gpu_models)?;
        m.serialize_entry("mig", &mig)?;
        m.serialize_entry("mig_count", &mig_count)?;
        m.serialize_entry("nodes", &r.nodes.max(1))?;
        m.serialize_entry("cpus", &r.cpus)?;
        m.serialize_entry("memory_bytes", &r.memory_bytes)?;
        // Only where the job has them (sbatch -w / -x).
        if !r.nodelist.is_empty() {
            m.serialize_entry("nodelist", &r.nodelist)?;
        }
        if !r.exclude.is_empty() {
            m.serialize_entry("exclude", &r.exclude)?;
        }
        // Only where the job has one (sbatch -C).
        if !r.constraint.is_empty() {
            m.serialize_entry("constraint", &r.constraint)?;
        }
        m.end()
    }
}

impl serde::Serialize for JobJson<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        static NO_SPEC: std::sync::OnceLock<pb::JobSpec> = std::sync::OnceLock::new();
        static NO_RESOURCES: std::sync::OnceLock<pb::Resources> = std::sync::OnceLock::new();
        let j = self.job;
        let spec = j
            .spec
            .as_ref()
            .unwrap_or_else(|| NO_SPEC.get_or_init(pb::JobSpec::default));
        let r = spec
            .resources
            .as_ref()
            .unwrap_or_else(|| NO_RESOURCES.get_or_init(pb::Resources::default));
        // Keys in alphabetical order, as the Value-based output had them.
        let env: std::collections::BTreeMap<&String, &String> = spec.env.iter().collect();
        let mut m = ser.serialize_map(None)?;
        m.serialize_entry("account", &spec.account)?;
        m.serialize_entry(
            "allocations",
            &j.allocations.iter().map(AllocJson).collect::<Vec<_>>(),
        )?;
        if spec.array_task_id.is_some() {
            m.serialize_entry("array", &spec.array)?;
            m.serialize_entry("array_job_id", &spec.array_job_id)?;
            m.serialize_entry("array_task_id", &spec.array_task_id)?;
        }
        m.serialize_entry("attempt", &j.attempt)?;
        // The service class: guaranteed, or opportunistic (runs in others' idle).
        let class = if spec.opportunistic {
            "opportunistic"
        } else {
            "guaranteed"
        };
        m.serialize_entry("class", class)?;
        m.serialize_entry("command", &spec.command)?;
        m.serialize_entry("comment", &non_empty(&spec.comment))?;
        m.serialize_entry("wckey", &non_empty(&spec.wckey))?;
        m.serialize_entry("mail_type", &non_empty(&spec.mail_type))?;
        m.serialize_entry("mail_user", &non_empty(&spec.mail_user))?;
        m.serialize_entry(
            "dependencies",
            &spec
                .dependencies
                .iter()
                .map(|d| (dependency_kind(d.kind), d.job_id))
                .map(|(kind, job_id)| DepJson { kind, job_id })
                .collect::<Vec<_>>(),
        )?;
        m.serialize_entry("elapsed_secs", &(elapsed_ms(j, self.now) / 1000))?;
        m.serialize_entry("end_time", &time_str(j.end_time_ms))?;
        m.serialize_entry("env", &env)?;
        m.serialize_entry("exit_code", &j.exit_code)?;
        m.serialize_entry("expected_start", &time_str(j.expected_start_ms))?;
        if let Some(u) = self.gpu_use {
            m.serialize_entry("gpu_use", u)?;
        }
        m.serialize_entry("gpus", &j.gpus)?;
        m.serialize_entry("hold", &non_empty(&j.hold))?;
        m.serialize_entry("id", &j.id)?;
        // Only for an allocation (`gpuctl alloc`): it runs no command or script.
        if spec.interactive {
            m.serialize_entry("interactive", &true)?;
        }
        m.serialize_entry("launch_time", &time_str(j.launch_time_ms))?;
        // Only for a job that restarts after failures (`max_restarts`).
        if spec.max_restarts > 0 {
            m.serialize_entry("max_restarts", &spec.max_restarts)?;
        }
        m.serialize_entry("name", &spec.name)?;
        m.serialize_entry("node", &non_empty(&j.node))?;
        m.serialize_entry("partition", &spec.partition)?;
        m.serialize_entry("priority", &spec.priority)?;
        m.serialize_entry("qos", &spec.qos)?;
        m.serialize_entry("reason", &j.reason)?;
        m.serialize_entry("resources", &ResourcesJson(r))?;
        if spec.max_restarts > 0 {
            m.serialize_entry("restarts", &j.restarts)?;
        }
        m.serialize_entry("script", &non_empty(&spec.script))?;
        m.serialize_entry("signal", &non_empty(&spec.signal))?;
        m.serialize_entry("start_time", &time_str(j.start_time_ms))?;
        m.serialize_entry("state", state_name(j.state()))?;
        m.serialize_entry("steps", &StepsJson(&j.steps))?;
        m.serialize_entry("stderr", &non_empty(&spec.stderr))?;
        m.serialize_entry("stdout", non_empty(&spec.stdout).unwrap_or("gpuctl-%j.out"))?;
        m.serialize_entry("submit_time", &time_str(j.submit_time_ms))?;
        m.serialize_entry("time_limit_secs", &j.time_limit_secs)?;
        m.serialize_entry("user", &spec.user)?;
        m.serialize_entry("warnings", &j.warnings)?;
        m.serialize_entry("workdir", &spec.workdir)?;
        m.end()
    }
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
            "jobs": g.jobs,
            "compute_allocated_milli": g.compute_allocated_milli,
            "memory_allocated_mib": g.memory_allocated_mib,
            "mig": g.mig.iter().map(|m| json!({
                "uuid": m.uuid,
                "profile": m.profile,
                "memory_mib": m.memory_mib,
                "job_id": if m.allocated_to == 0 { Value::Null } else { json!(m.allocated_to) },
            })).collect::<Vec<_>>(),
            "metrics": g.metrics.as_ref().map(metrics_json),
            "mig_changing_to": if g.mig_changing { json!(g.mig_changing_to) } else { Value::Null },
        })).collect::<Vec<_>>(),
        "cpus": n.cpus,
        "cpus_allocated": n.cpus_allocated,
        "partitions": n.partitions,
        "features": n.features,
        "memory_bytes": n.memory_bytes,
        "memory_allocated": n.memory_allocated,
        "last_seen": rfc3339(n.last_seen_ms),
        "gpu_backend": n.gpu_backend,
    })
}

/// Whether a character may reach a terminal as it is: no control characters (ESC,
/// newline, NUL, ...) and no invisible ones (zero-width spaces, bidirectional overrides
/// that reorder what follows: `gpuctl_proto::text::invisible`).
fn printable_char(c: char) -> bool {
    !(c.is_control() || gpuctl_proto::text::invisible(c))
}

/// `s` with every character that is not `printable_char` escaped (`\u{1b}`, `\n`):
/// what other users named cannot move the cursor, forge rows or recolour a terminal.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().all(printable_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if printable_char(c) {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
    }
    std::borrow::Cow::Owned(out)
}

fn clean_rows(rows: &mut [Vec<String>]) {
    for cell in rows.iter_mut().flatten() {
        if let std::borrow::Cow::Owned(o) = printable(cell) {
            *cell = o;
        }
    }
}

pub fn table(header: &[&str], mut rows: Vec<Vec<String>>) -> String {
    clean_rows(&mut rows);
    if rows.len() > 200 {
        return plain_table(header, &rows);
    }
    let mut b = tabled::builder::Builder::default();
    b.push_record(header.iter().map(|s| s.to_string()));
    for r in rows {
        b.push_record(r);
    }
    let mut t = b.build();
    t.with(Style::blank());
    format!("{t}\n")
}

/// The same layout as tabled's blank style (each cell padded by a space on both sides,
/// cells separated by a space), in one pass: `queue` of 100,000 jobs stays fast.
fn plain_table(header: &[&str], rows: &[Vec<String>]) -> String {
    use unicode_width::UnicodeWidthStr;
    let mut widths: Vec<usize> = header.iter().map(|h| h.width()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.width());
        }
    }
    let total: usize = widths.iter().map(|w| w + 3).sum();
    let mut out = String::with_capacity(total * (rows.len() + 1));
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        for (i, (c, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push(' ');
            out.push_str(c);
            out.extend(std::iter::repeat_n(' ', w - c.width() + 1));
        }
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

/// The GPU part of a request, as the scheduler reads it.
fn gpu_of(r: &pb::Resources) -> GpuRequest {
    gpuctl_proto::convert::gpu_request(r.gpu.as_ref())
}

/// The GPU request in a few characters: `2`, `0.25`, `10GiB`, `mig:3g.40gb`, `2x8`.
pub fn gpu_request(r: &pb::Resources) -> String {
    let per_node = match gpu_of(r) {
        GpuRequest::None => "0".to_string(),
        GpuRequest::Whole { count } => count.to_string(),
        GpuRequest::Mig { profile, count } if count > 1 => format!("{count}xmig:{profile}"),
        GpuRequest::Mig { profile, .. } => format!("mig:{profile}"),
        GpuRequest::Share {
            compute_milli: Some(c),
            ..
        } => format!("{}", f64::from(c) / 1000.0),
        GpuRequest::Share { memory_mib, .. } => format!("{}MiB", memory_mib.unwrap_or(0)),
    };
    if r.nodes > 1 {
        format!("{}x{per_node}", r.nodes)
    } else {
        per_node
    }
}

/// A time for tables: to the second, without the `T` and `Z`.
pub fn short_time(ms: i64) -> String {
    if ms <= 0 {
        return "N/A".into();
    }
    let t = UNIX_EPOCH + Duration::from_millis(ms.min(MAX_RFC3339_MS) as u64);
    let t = humantime::format_rfc3339_seconds(t).to_string();
    t.replace('T', " ").trim_end_matches('Z').to_string()
}

/// A job's id as squeue and sacct show it: `12`, or `12_3` for task 3 of array 12.
pub fn job_id_text(j: &pb::Job) -> String {
    match j
        .spec
        .as_ref()
        .and_then(|s| s.array_task_id.map(|t| (s.array_job_id, t)))
    {
        Some((array, t)) => format!("{array}_{t}"),
        None => j.id.to_string(),
    }
}

/// The columns `gpuctl queue -o` knows.
pub const QUEUE_COLUMNS: &[&str] = &[
    "jobid",
    "name",
    "user",
    "account",
    "partition",
    "qos",
    "state",
    "time",
    "start_time",
    "submit_time",
    "gpus",
    "node",
    "reason",
    "attempt",
    "time_limit",
];

/// The default columns (`--start` adds the expected start).
pub fn default_queue_columns(with_start: bool) -> Vec<String> {
    let mut c: Vec<String> = [
        "jobid",
        "partition",
        "name",
        "user",
        "state",
        "time",
        "gpus",
        "node",
        "reason",
    ]
    .map(String::from)
    .to_vec();
    if with_start {
        c.insert(5, "start_time".into());
    }
    c
}

fn queue_cell(j: &pb::Job, col: &str, now: i64) -> String {
    let none = pb::JobSpec::default();
    let spec = j.spec.as_ref().unwrap_or(&none);
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    match col {
        "jobid" => job_id_text(j),
        "partition" => dash(&spec.partition),
        "name" => spec.name.clone(),
        "user" => spec.user.clone(),
        "account" => dash(&spec.account),
        "qos" => dash(&spec.qos),
        "state" => state_name(j.state()).to_string(),
        "time" => slurm_duration(elapsed_ms(j, now)),
        "start_time" => short_time(if j.state() == JobState::Pending {
            j.expected_start_ms
        } else {
            j.start_time_ms
        }),
        "submit_time" => short_time(j.submit_time_ms),
        "gpus" => gpu_request(spec.resources.as_ref().unwrap_or(&pb::Resources::default())),
        "node" => dash(&j.node),
        "reason" => short_reason(&j.reason),
        "attempt" => j.attempt.to_string(),
        "time_limit" => {
            slurm_duration(i64::try_from(j.time_limit_secs).unwrap_or(i64::MAX / 1000) * 1000)
        }
        _ => String::new(),
    }
}

/// The REASON cell: at most [`REASON_WIDTH`] characters (a long warning would pad every
/// row of the table to its width; `show` and `--json` carry all of it).
fn short_reason(reason: &str) -> String {
    if reason.is_empty() {
        return "-".into();
    }
    if reason.chars().count() <= REASON_WIDTH {
        return reason.to_string();
    }
    let cut: String = reason.chars().take(REASON_WIDTH - 3).collect();
    format!("{}...", cut.trim_end())
}

const REASON_WIDTH: usize = 40;

/// The queue as a table of `columns` (names from `QUEUE_COLUMNS`).
/// Pending tasks of one array waiting for the same reason fold into one row, like
/// squeue's `12_[3-99%8]`; the other rows are one job each.
pub fn queue_table(jobs: &[pb::Job], columns: &[String], header: bool) -> String {
    let now = now_ms();
    let fold_key = |j: &pb::Job| {
        let s = j.spec.as_ref()?;
        (j.state() == JobState::Pending && s.array_task_id.is_some())
            .then(|| (s.array_job_id, j.reason.clone()))
    };
    let mut folded: std::collections::HashMap<(u64, String), Vec<u32>> =
        std::collections::HashMap::new();
    for j in jobs {
        if let Some(k) = fold_key(j) {
            let task = j.spec.as_ref().and_then(|s| s.array_task_id);
            folded.entry(k).or_default().extend(task);
        }
    }
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(jobs.len());
    for j in jobs {
        // The first task of a group stands for all of it; the rest are skipped.
        let group = fold_key(j).map(|k| folded.remove_entry(&k));
        if matches!(group, Some(None)) {
            continue;
        }
        let mut row: Vec<String> = columns.iter().map(|c| queue_cell(j, c, now)).collect();
        if let Some(Some((k, mut tasks))) = group
            && tasks.len() > 1
        {
            tasks.sort_unstable();
            let mut id = gpuctl_sched::array::fold(&tasks);
            let throttle = j.spec.as_ref().and_then(|s| s.array.rsplit_once('%'));
            if let Some((_, n)) = throttle {
                id.insert_str(id.len() - 1, &format!("%{}", n.trim()));
            }
            for (c, cell) in columns.iter().zip(row.iter_mut()) {
                if c == "jobid" {
                    *cell = format!("{}_{id}", k.0);
                }
            }
        }
        rows.push(row);
    }
    let upper: Vec<String> = columns.iter().map(|c| c.to_uppercase()).collect();
    let h: Vec<&str> = upper.iter().map(String::as_str).collect();
    let out = table(&h, rows);
    if header {
        out
    } else {
        out.split_once('\n')
            .map_or(String::new(), |(_, rest)| rest.to_string())
    }
}

pub fn metrics_json(m: &pb::GpuMetrics) -> Value {
    json!({
        "util_pct": m.util_pct,
        "mem_util_pct": m.mem_util_pct,
        "mem_used_mib": m.mem_used_mib,
        "temp_c": m.temp_c,
        "fan_pct": m.fan_pct,
        "power_w": m.power_w,
        "power_limit_w": m.power_limit_w,
        "ecc_uncorrected": m.ecc_uncorrected,
        "jobs": m.jobs.iter().map(|j| json!({
            "job_id": j.job_id, "mem_used_mib": j.mem_used_mib, "processes": j.processes,
        })).collect::<Vec<_>>(),
        "time": rfc3339(m.time_ms),
    })
}

/// One row per GPU with its latest metrics (`gpuctl nodes`, below the node table).
/// A GPU's MIG layout: its instances' profiles, `*` on those in use (`-`: not in MIG
/// mode).
fn mig_layout(g: &pb::Gpu) -> String {
    let now = if g.mig.is_empty() {
        "-".to_string()
    } else {
        g.mig
            .iter()
            .map(|m| {
                let used = if m.allocated_to != 0 { "*" } else { "" };
                format!("{}{used}", m.profile)
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    if !g.mig_changing {
        return now;
    }
    // Dynamic MIG: the layout it is being changed to.
    let to = if g.mig_changing_to.is_empty() {
        "whole".to_string()
    } else {
        g.mig_changing_to.join(",")
    };
    format!("{now} -> {to}")
}

/// The GPUs a node's GPU has allocated, as the controller's metrics count them: a MIG
/// instance its slices of seven, a share its compute.
pub fn gpu_allocated(g: &pb::Gpu) -> f64 {
    if g.mig.is_empty() {
        f64::from(g.compute_allocated_milli.min(1000)) / 1000.0
    } else {
        g.mig
            .iter()
            .filter(|m| m.allocated_to != 0)
            .map(|m| gpuctl_sched::fairshare::mig_fraction(&m.profile))
            .sum()
    }
}

pub fn gpus_table(nodes: &[pb::Node]) -> String {
    let mut rows = Vec::new();
    for n in nodes {
        for g in &n.gpus {
            let Some(m) = &g.metrics else { continue };
            rows.push(vec![
                n.name.clone(),
                g.index.to_string(),
                g.model.clone(),
                mig_layout(g),
                format!("{}%", m.util_pct),
                format!(
                    "{:.1}/{:.0}GiB",
                    m.mem_used_mib as f64 / 1024.0,
                    g.memory_mib as f64 / 1024.0
                ),
                format!("{}C", m.temp_c),
                format!("{:.0}/{:.0}W", m.power_w, m.power_limit_w),
                if g.jobs.is_empty() {
                    "-".into()
                } else {
                    g.jobs
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                },
            ]);
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    table(
        &[
            "NODE", "GPU", "MODEL", "MIG", "UTIL", "MEMORY", "TEMP", "POWER", "JOBS",
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
                if n.partitions.is_empty() {
                    "-".into()
                } else {
                    n.partitions.join(",")
                },
                if n.features.is_empty() {
                    "-".into()
                } else {
                    n.features.join(",")
                },
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
            "PARTITIONS",
            "FEATURES",
            "REASON",
        ],
        rows,
    )
}

/// An output file as the job's node names it: `%j`, `%x`, `%A`, `%a` (and `%N` for a
/// job on one node) expanded, relative to its workdir; `%t` stays (one file a rank).
fn output_shown(template: &str, j: &pb::Job, spec: &pb::JobSpec) -> String {
    let ranks = j.allocations.len();
    let template = match template {
        "" if ranks > 1 => "gpuctl-%j.%t.out",
        "" => "gpuctl-%j.out",
        t => t,
    };
    let array = spec.array_task_id.map(|t| (spec.array_job_id, t));
    let node = (ranks == 1).then(|| j.allocations[0].node.clone());
    let path = gpuctl_proto::text::fill_pattern(template, |p| match p {
        'j' | 'J' => Some(j.id.to_string()),
        'x' => Some(spec.name.replace('/', "_")),
        'u' => Some(spec.user.replace('/', "_")),
        's' => Some("batch".into()),
        'N' => node.clone(),
        'A' => Some(array.map_or(j.id, |a| a.0).to_string()),
        'a' => Some(array.map_or(0, |a| a.1).to_string()),
        _ => None,
    });
    if path.starts_with('/') || spec.workdir.is_empty() {
        path
    } else {
        format!("{}/{path}", spec.workdir.trim_end_matches('/'))
    }
}

pub fn show_job(j: &pb::Job) -> String {
    let spec = j.spec.clone().unwrap_or_default();
    let stdout = output_shown(&spec.stdout, j, &spec);
    let r = spec.resources.unwrap_or_default();
    let v = job_json(j);
    let s = |k: &str| match &v[k] {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = String::new();
    let mut line = |k: &str, val: String| out.push_str(&format!("{k:>12}: {}\n", printable(&val)));
    line("JobId", j.id.to_string());
    line("Name", spec.name.clone());
    line("User", spec.user.clone());
    if let Some(t) = spec.array_task_id {
        line("ArrayJobId", spec.array_job_id.to_string());
        line("ArrayTaskId", t.to_string());
    }
    line("Partition", spec.partition.clone());
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
            gpu_request(&r),
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
    if spec.opportunistic {
        line(
            "Class",
            "opportunistic (runs in the idle of GPUs others hold; yields when they need them)"
                .into(),
        );
    }
    if !spec.dependencies.is_empty() {
        line(
            "Dependency",
            spec.dependencies
                .iter()
                .map(|d| format!("{}:{}", dependency_kind(d.kind), d.job_id))
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    for w in &j.warnings {
        line("Warning", w.clone());
    }
    line("SubmitTime", s("submit_time"));
    line("StartTime", s("start_time"));
    if j.launch_time_ms > 0 {
        line("LaunchTime", s("launch_time"));
    }
    line("EndTime", s("end_time"));
    line("Elapsed", slurm_duration(elapsed_ms(j, now_ms())));
    if spec.interactive {
        line(
            "Command",
            "(an interactive allocation: gpuctl alloc)".into(),
        );
    } else if spec.command.is_empty() {
        let finished = state_name(j.state()) != "PENDING" && state_name(j.state()) != "RUNNING";
        line(
            "Script",
            if spec.script.is_empty() && finished {
                "(not kept once the job ended)".to_string()
            } else {
                format!("{} lines", spec.script.lines().count())
            },
        );
    } else {
        line("Command", spec.command.join(" "));
    }
    line("WorkDir", spec.workdir.clone());
    line("StdOut", stdout);
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
mod tests;
