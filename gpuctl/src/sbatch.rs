//! Slurm batch scripts as they are: `gpuctl submit train.sbatch` reads the `#SBATCH`
//! lines at the top of a shell script (as sbatch does: up to the first command) and
//! runs the whole script as the job. Options gpuctl has no equivalent for are refused by
//! name, with the line and column; a few that change nothing here (`--hint`,
//! `--cpu-bind`...) are ignored with a warning; `--comment`, `--wckey` and the mail
//! options are kept with the job.

use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use gpuctl_core::record::GpuPart;

use crate::jobfile::{Job, JobFileError, at_span, parse_dependency};

/// Whether `text` is a batch script rather than a TOML job file: it starts with `#!`
/// or has `#SBATCH` lines.
pub fn is_batch_script(text: &str) -> bool {
    text.starts_with("#!") || directives(text).next().is_some()
}

/// The `#SBATCH` lines: (byte offset of the options, the options), up to the first line
/// that is neither blank nor a comment.
fn directives(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut offset = 0;
    text.split_inclusive('\n')
        .map(move |line| {
            let at = offset;
            offset += line.len();
            (at, line.trim_end_matches(['\n', '\r']))
        })
        .take_while(|(_, l)| l.trim().is_empty() || l.trim_start().starts_with('#'))
        .filter_map(|(at, l)| {
            let rest = l.strip_prefix("#SBATCH")?;
            rest.starts_with(char::is_whitespace)
                .then(|| (at + "#SBATCH".len(), rest))
        })
}

/// What a batch script asks for besides the job: its `--export`, if any, and whether
/// it is queued held (`-H`).
#[derive(Debug, Default, PartialEq)]
pub struct Extra {
    pub export: Option<String>,
    /// A batch script (not a TOML job file): it takes the submitting shell's
    /// environment unless `--export` says otherwise, as sbatch's do.
    pub batch: bool,
    pub hold: bool,
    /// Options that change nothing here, each with why.
    pub warnings: Vec<String>,
}

/// Options with no effect in gpuctl, ignored with a warning (the tools that drive
/// Slurm write them into every script).
const IGNORED: &[&str] = &[
    "hint",
    "open-mode",
    "get-user-env",
    "distribution",
    "cpu-bind",
    "mpi",
    "kill-on-bad-exit",
];

/// Options whose value is optional (`--get-user-env` or `--get-user-env=10L`).
const OPTIONAL_VALUE: &[&str] = &["get-user-env", "kill-on-bad-exit"];

/// The long name of a short option.
fn long_name(short: char) -> Option<&'static str> {
    Some(match short {
        'J' => "job-name",
        'o' => "output",
        'e' => "error",
        't' => "time",
        'N' => "nodes",
        'n' => "ntasks",
        'c' => "cpus-per-task",
        'G' => "gpus",
        'p' => "partition",
        'D' => "chdir",
        'a' => "array",
        'd' => "dependency",
        'q' => "qos",
        'A' => "account",
        'C' => "constraint",
        'H' => "hold",
        's' => "oversubscribe",
        'w' => "nodelist",
        'x' => "exclude",
        _ => return None,
    })
}

/// Options that take no value.
const FLAGS: &[&str] = &[
    "requeue",
    "no-requeue",
    "exclusive",
    "hold",
    "oversubscribe",
    "opportunistic",
];

/// One option from a `#SBATCH` line: its long name, its value, and where it stands.
struct Opt {
    name: String,
    value: String,
    span: Range<usize>,
}

/// The words of one `#SBATCH` line with their byte offsets, as a shell splits them:
/// quotes group (and are removed), a `#` that starts a word starts a comment.
fn words(line: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut start = None;
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c.is_whitespace() => {
                if let Some(s) = start.take() {
                    out.push((s, std::mem::take(&mut cur)));
                }
            }
            None if c == '#' && start.is_none() => break,
            None => {
                start.get_or_insert(i);
                if c == '"' || c == '\'' {
                    quote = Some(c);
                } else {
                    cur.push(c);
                }
            }
        }
    }
    if let Some(s) = start {
        out.push((s, cur));
    }
    out
}

/// Splits the options of one `#SBATCH` line (`--name=value`, `--name value`, `-X value`,
/// `-Xvalue`).
fn options(at: usize, line: &str) -> Result<Vec<Opt>, (Range<usize>, String)> {
    split_options(words(line).into_iter().map(|(i, w)| (at + i, w)).collect())
}

/// Options from words already split (a `#SBATCH` line's, or sbatch's command line).
fn split_options(words: Vec<(usize, String)>) -> Result<Vec<Opt>, (Range<usize>, String)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let (start, w) = (words[i].0, words[i].1.as_str());
        let span = start..start + w.len().max(1);
        let (name, inline) = if let Some(long) = w.strip_prefix("--") {
            match long.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (long.to_string(), None),
            }
        } else if let Some(short) = w.strip_prefix('-') {
            let mut chars = short.chars();
            let c = chars.next().unwrap_or(' ');
            let name = long_name(c).ok_or_else(|| {
                (
                    span.clone(),
                    format!("#SBATCH option -{c} is not supported by gpuctl"),
                )
            })?;
            let rest: String = chars.collect();
            (name.to_string(), (!rest.is_empty()).then_some(rest))
        } else {
            return Err((span, format!("#SBATCH: {w:?} is not an option")));
        };
        let value = if OPTIONAL_VALUE.contains(&name.as_str()) {
            inline.unwrap_or_default()
        } else if FLAGS.contains(&name.as_str()) {
            if let Some(v) = inline {
                return Err((span, format!("#SBATCH --{name} takes no value (got {v:?})")));
            }
            String::new()
        } else if let Some(v) = inline {
            v
        } else {
            i += 1;
            match words.get(i) {
                Some((_, v)) => v.to_string(),
                None => return Err((span, format!("#SBATCH --{name} needs a value"))),
            }
        };
        out.push(Opt { name, value, span });
        i += 1;
    }
    Ok(out)
}

/// What a zero time limit gets, on the command line, in `#SBATCH` and in a job file
/// alike: Slurm reads 0 as unlimited, and gpuctl has no unlimited jobs.
pub const ZERO_TIME: &str = "a time limit of 0 (Slurm's \"unlimited\") is not offered: give one of at least 1 second (the cluster's limits.max_time_limit is the longest)";

/// Slurm's time formats: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`.
pub fn slurm_time(v: &str) -> Result<Duration, String> {
    let bad = || format!("--time {v:?} is not a Slurm time (M, M:S, H:M:S, D-H, D-H:M or D-H:M:S)");
    if matches!(v.to_ascii_lowercase().as_str(), "infinite" | "unlimited") {
        return Err("--time: gpuctl has no unlimited jobs; give a time limit".into());
    }
    let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
    let (days, rest) = match v.split_once('-') {
        Some((d, r)) => (Some(num(d)?), r),
        None => (None, v),
    };
    let parts: Vec<u64> = rest.split(':').map(num).collect::<Result<_, _>>()?;
    let secs = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + s,
        (None, [h, m, s]) => h * 3600 + m * 60 + s,
        (Some(d), [h]) => d * 86400 + h * 3600,
        (Some(d), [h, m]) => d * 86400 + h * 3600 + m * 60,
        (Some(d), [h, m, s]) => d * 86400 + h * 3600 + m * 60 + s,
        _ => return Err(bad()),
    };
    if secs == 0 {
        return Err(ZERO_TIME.into());
    }
    Ok(Duration::from_secs(secs))
}

/// A begin time as sbatch takes it, in this machine's time zone: `now`, `now+N` with
/// an optional unit (seconds, minutes, hours, days, weeks; seconds by default),
/// `HH:MM[:SS]` (today, or tomorrow once past), `midnight`, `noon`, `teatime`,
/// `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM[:SS]`. Answers Unix milliseconds.
pub fn begin_time(v: &str, now: &jiff::Zoned) -> Result<i64, String> {
    let at = begin_any(v, now)?;
    let latest = now.timestamp().as_millisecond() + MAX_BEGIN_AHEAD_MS;
    if at > latest {
        return Err(format!(
            "--begin {v:?}: the begin time must be within a year from now (hold the job with -H and release it later instead)"
        ));
    }
    Ok(at)
}

/// How far ahead a begin time may be.
const MAX_BEGIN_AHEAD_MS: i64 = 366 * 86_400_000;

fn begin_any(v: &str, now: &jiff::Zoned) -> Result<i64, String> {
    let bad = || {
        format!(
            "--begin {v:?} is not a time: now+2hours, now+30minutes, 16:00, midnight, 2026-12-24 or 2026-12-24T08:00"
        )
    };
    let lower = v.trim().to_ascii_lowercase();
    let now_ms = now.timestamp().as_millisecond();
    if let Some(rest) = lower.strip_prefix("now") {
        if rest.is_empty() {
            return Ok(now_ms);
        }
        let rest = rest.strip_prefix('+').ok_or_else(bad)?;
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: i64 = rest[..end].parse().map_err(|_| bad())?;
        let unit: i64 = match &rest[end..] {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 604_800,
            _ => return Err(bad()),
        };
        return n
            .checked_mul(unit * 1000)
            .and_then(|d| now_ms.checked_add(d))
            .ok_or_else(|| {
                format!("--begin {v:?}: the begin time must be within a year from now")
            });
    }
    let at_next = |t: jiff::civil::Time| -> Result<i64, String> {
        let today = now.date().to_datetime(t).to_zoned(now.time_zone().clone());
        let z = today.map_err(|e| e.to_string())?;
        let z = if z.timestamp() <= now.timestamp() {
            z.checked_add(jiff::Span::new().days(1))
                .map_err(|e| e.to_string())?
        } else {
            z
        };
        Ok(z.timestamp().as_millisecond())
    };
    let named = match lower.as_str() {
        "midnight" => Some(jiff::civil::time(0, 0, 0, 0)),
        "noon" => Some(jiff::civil::time(12, 0, 0, 0)),
        "teatime" => Some(jiff::civil::time(16, 0, 0, 0)),
        _ => None,
    };
    // A time of day alone (jiff would also read one out of a whole date and time).
    let time_only = || {
        (!lower.contains('-'))
            .then(|| lower.parse::<jiff::civil::Time>().ok())
            .flatten()
    };
    if let Some(t) = named.or_else(time_only) {
        return at_next(t);
    }
    // A date jiff cannot place (past its range, e.g. 9999-12-31T23:59 in a zone east
    // of UTC) is not a time for this rule either.
    let local = |dt: jiff::civil::DateTime| -> Result<i64, String> {
        dt.to_zoned(now.time_zone().clone())
            .map(|z| z.timestamp().as_millisecond())
            .map_err(|_| {
                if dt.year() > now.year() {
                    format!("--begin {v:?}: the begin time must be within a year from now")
                } else {
                    bad()
                }
            })
    };
    if let Ok(dt) = lower.parse::<jiff::civil::DateTime>() {
        return local(dt);
    }
    if let Ok(d) = lower.parse::<jiff::civil::Date>() {
        return local(d.to_datetime(jiff::civil::time(0, 0, 0, 0)));
    }
    Err(bad())
}

/// Slurm memory: a number with an optional K, M, G or T suffix (default M).
pub(crate) fn slurm_memory(v: &str) -> Result<u64, String> {
    let (digits, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => v.split_at(i),
        None => (v, "M"),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("--mem {v:?} is not a size (e.g. 16G, 4000M)"))?;
    let shift = match unit.to_ascii_uppercase().trim_end_matches('B') {
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("--mem {v:?}: unit {unit:?} is not K, M, G or T")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("--mem {v:?} is too large"))
}

/// A GPU count with an optional type: `N`, `TYPE:N`, or (in `--gres`) `gpu[:TYPE][:N]`.
/// GPUs asked for: whole GPUs, an optional model, and a share of one GPU in milli-GPUs
/// (`0.5` or `A100:0.25`, as `gpus = 0.5` in a job file; 0 = whole GPUs).
pub(crate) type GpuAsk = (u32, Option<String>, u32);

/// `N`, `TYPE`, `TYPE:N`, a share below 1 (`0.5`, `TYPE:0.5`); with `gres`, after `gpu:`.
pub(crate) fn gpus_of(v: &str, gres: bool) -> Result<GpuAsk, String> {
    let mut parts: Vec<&str> = v.split(':').collect();
    if gres {
        if parts.first() != Some(&"gpu") {
            return Err(format!(
                "--gres {v:?}: gpuctl knows the gpu resource only (gpu:N or gpu:TYPE:N)"
            ));
        }
        parts.remove(0);
    }
    // A number: whole GPUs, or a share of one below 1 (in thousandths).
    let amount = |s: &str| -> Result<(u32, u32), String> {
        if let Ok(n) = s.parse::<u32>() {
            return Ok((n, 0));
        }
        match s.parse::<f64>() {
            Ok(x) if x > 0.0 && x < 1.0 && (x * 1000.0).round() >= 1.0 => {
                Ok((0, (x * 1000.0).round() as u32))
            }
            Ok(_) => Err(format!(
                "{v:?}: {s:?} is neither a whole number of GPUs nor a share of one between 0.001 and 0.999"
            )),
            Err(_) => Err(format!("{v:?}: {s:?} is not a GPU count")),
        }
    };
    let numeric = |s: &str| s.starts_with(|c: char| c.is_ascii_digit() || c == '.');
    let (n, model) = match parts.as_slice() {
        [] => return Ok((1, None, 0)),
        [n] if numeric(n) => (*n, None),
        [t] if t.starts_with(|c: char| c.is_ascii_alphabetic()) => {
            return Ok((1, Some(t.to_string()), 0));
        }
        [t] => {
            return Err(format!(
                "{v:?}: {t:?} is neither a GPU count nor a GPU model"
            ));
        }
        [t, n] => (*n, Some(t.to_string())),
        _ => return Err(format!("{v:?} is not N, TYPE:N or a share like 0.5")),
    };
    let (whole, milli) = amount(n)?;
    Ok((whole, model, milli))
}

/// Applies one option (of a `#SBATCH` line or sbatch's command line) to the job.
fn apply(o: &Opt, job: &mut Job, extra: &mut Extra, pn: &mut PerNode) -> Result<(), String> {
    let v = o.value.as_str();
    let fail = |m: String| m;
    match o.name.as_str() {
        "job-name" => job.spec.name = v.to_string(),
        "output" => job.spec.stdout = v.to_string(),
        "error" => job.spec.stderr = v.to_string(),
        "time" => job.spec.resources.time_limit_secs = slurm_time(v).map_err(fail)?.as_secs(),
        "nodes" => {
            let min = v.split('-').next().unwrap_or(v);
            job.spec.resources.nodes = min
                .parse()
                .map_err(|_| fail(format!("--nodes {v:?} is not N or N-M")))?;
        }
        "ntasks" => {
            let n = v.parse::<u32>();
            pn.ntasks = Some(n.map_err(|_| fail(format!("--ntasks {v:?} is not a number")))?);
        }
        "ntasks-per-node" => {
            let n = v.parse::<u32>();
            let why = || format!("--ntasks-per-node {v:?} is not a number");
            pn.per_node = Some(n.map_err(|_| fail(why()))?);
        }
        "cpus-per-task" => {
            job.spec.resources.cpus = v
                .parse()
                .map_err(|_| fail(format!("--cpus-per-task {v:?} is not a number")))?
        }
        "mem" => job.spec.resources.memory_bytes = slurm_memory(v).map_err(fail)?,
        "mem-per-cpu" => pn.mem_per_cpu = Some(slurm_memory(v).map_err(fail)?),
        "mem-per-gpu" => pn.mem_per_gpu = Some(slurm_memory(v).map_err(fail)?),
        "cpus-per-gpu" => {
            let n = v.parse::<u32>().ok().filter(|n| *n > 0);
            let why = || format!("--cpus-per-gpu {v:?} is not a number of CPUs");
            pn.cpus_per_gpu = Some(n.ok_or_else(|| fail(why()))?);
        }
        // Per node, but for --gpus (the job's, split over its nodes at the
        // end) and --gpus-per-task (times the tasks on a node, at the end).
        "gres" | "gpus" | "gpus-per-node" | "gpus-per-task" => {
            let (n, model, milli) = gpus_of(v, o.name == "gres").map_err(fail)?;
            pn.gpus_per_task = o.name == "gpus-per-task" && milli == 0;
            job.spec.resources.gpu = crate::jobfile::gpu_request(n, milli, 0);
            job.spec.resources.gpu_models.extend(model);
            if o.name == "gpus" && n > 0 {
                pn.total_gpus = Some((n, o.span.clone()));
            } else {
                pn.total_gpus = None;
            }
        }
        "dependency" => job.spec.dependencies = parse_dependency(v).map_err(fail)?,
        "qos" => job.spec.qos = v.to_string(),
        "account" => job.spec.account = v.to_string(),
        "comment" => job.spec.comment = v.to_string(),
        "wckey" => job.spec.wckey = v.to_string(),
        "mail-type" => job.spec.mail_type = crate::jobfile::mail_types(v).map_err(fail)?,
        "mail-user" => job.spec.mail_user = v.to_string(),
        "signal" => {
            // sbatch's B: (the batch shell only) is how gpuctl signals anyway.
            let sig = v.strip_prefix("B:").unwrap_or(v);
            gpuctl_proto::convert::parse_signal_spec(sig).map_err(fail)?;
            job.spec.signal = sig.to_string();
        }
        "requeue" => job.spec.requeue = true,
        // The whole node: sized by the controller to the nodes it may use.
        "exclusive" => job.spec.resources.exclusive = true,
        // Slurm's "share the allocation with other jobs": co-location by use.
        "oversubscribe" => job.spec.colocate = true,
        // gpuctl's own: the opportunistic class (`gpuctl submit --opportunistic`).
        "opportunistic" => job.spec.opportunistic = true,
        "hold" => extra.hold = true,
        "begin" => job.spec.begin_ms = begin_time(v, &jiff::Zoned::now()).map_err(fail)?,
        "no-requeue" => job.spec.requeue = false,
        "chdir" => job.workdir = Some(PathBuf::from(v)),
        "export" => extra.export = Some(v.to_string()),
        "nice" => {
            // Slurm's meaning: a positive nice lowers the priority, a negative
            // one raises it (which the controller allows admins only).
            let n: i32 = v
                .parse()
                .ok()
                .filter(|n: &i32| n.unsigned_abs() <= gpuctl_proto::convert::MAX_PRIORITY_ADJUST)
                .ok_or_else(|| {
                    fail(format!(
                        "--nice {v:?} must be a number from -{max} to {max}",
                        max = gpuctl_proto::convert::MAX_PRIORITY_ADJUST
                    ))
                })?;
            job.spec.priority = -n;
        }
        n if IGNORED.contains(&n) => extra
            .warnings
            .push(format!("#SBATCH --{n} has no effect in gpuctl; ignored")),
        "array" => {
            gpuctl_sched::array::parse(v, usize::MAX).map_err(fail)?;
            job.spec.array = v.to_string();
        }
        "partition" => job.spec.partition = v.to_string(),
        "constraint" => {
            job.spec.resources.constraint = gpuctl_sched::features::checked(v).map_err(fail)?
        }
        "nodelist" | "exclude" => {
            let list = gpuctl_sched::hostlist::split_list(v);
            if list.is_empty() {
                return Err(fail(format!("#SBATCH --{} names no node", o.name)));
            }
            crate::jobfile::check_node_list(&list, &o.name).map_err(fail)?;
            if o.name == "nodelist" {
                job.spec.resources.nodelist = list;
            } else {
                job.spec.resources.exclude = list;
            }
        }
        other => {
            return Err(fail(format!(
                "#SBATCH --{other} is not supported by gpuctl; remove it"
            )));
        }
    }
    Ok(())
}

/// The job a batch script describes. Its whole text is the job's script.
pub fn parse(file: &str, text: &str) -> Result<(Job, Extra), JobFileError> {
    parse_with(file, text, &[])
}

/// The same, with sbatch's command-line options (after the script's own: they win).
pub fn parse_with(
    file: &str,
    text: &str,
    command_line: &[String],
) -> Result<(Job, Extra), JobFileError> {
    let at = |span: Range<usize>, message: String| at_span(file, text, span, message);
    let mut job = Job::default();
    job.spec.name = default_name(file);
    job.spec.script = text.to_string();
    job.spec.stdout = "slurm-%j.out".into();
    let mut extra = Extra {
        batch: true,
        ..Extra::default()
    };
    let mut pn = PerNode::default();
    for (offset, line) in directives(text) {
        for o in options(offset, line).map_err(|(s, m)| at(s, m))? {
            apply(&o, &mut job, &mut extra, &mut pn).map_err(|m| at(o.span.clone(), m))?;
        }
    }
    // sbatch's command line after the script's lines: it wins, as sbatch's does.
    if !command_line.is_empty() {
        let words = command_line.iter().map(|w| (0, w.clone())).collect();
        let whole = |m: String| JobFileError::Whole {
            file: "the command line".into(),
            message: m.replace("#SBATCH ", ""),
        };
        for o in split_options(words).map_err(|(_, m)| whole(m))? {
            apply(&o, &mut job, &mut extra, &mut pn).map_err(whole)?;
        }
    }
    pn.apply(&mut job, file, text)?;
    Ok((job, extra))
}

/// What `#SBATCH` lines say per task or per job that becomes per node once all are
/// read (a node's tasks, their CPUs and GPUs, the job's total GPUs, memory per CPU/GPU).
#[derive(Default)]
struct PerNode {
    ntasks: Option<u32>,
    per_node: Option<u32>,
    mem_per_cpu: Option<u64>,
    mem_per_gpu: Option<u64>,
    /// `--cpus-per-gpu`: a node's CPUs, from its GPUs.
    cpus_per_gpu: Option<u32>,
    gpus_per_task: bool,
    /// `-G`/`--gpus`: the job's total (Slurm's meaning), split over its nodes.
    total_gpus: Option<(u32, Range<usize>)>,
}

impl PerNode {
    fn apply(self, job: &mut Job, file: &str, text: &str) -> Result<(), JobFileError> {
        let whole = |message: String| JobFileError::Whole {
            file: file.to_string(),
            message,
        };
        let nodes = job.spec.resources.nodes.max(1);
        let tasks_per_node = match (self.per_node, self.ntasks) {
            (Some(t), Some(n)) if n != t * nodes => {
                return Err(whole(format!(
                    "--ntasks={n} and --ntasks-per-node={t} over {nodes} nodes disagree"
                )));
            }
            (Some(t), _) => t,
            (None, Some(n)) if !n.is_multiple_of(nodes) => {
                return Err(whole(format!(
                    "--ntasks={n} over {nodes} nodes: gpuctl starts the same number of tasks on every node; give a multiple of {nodes}, or --ntasks-per-node"
                )));
            }
            (None, Some(n)) => n / nodes,
            (None, None) => 1,
        };
        if tasks_per_node == 0 {
            return Err(whole("--ntasks must be at least 1".into()));
        }
        job.spec.resources.tasks_per_node = tasks_per_node;
        // -c is per task: a node holds its tasks' CPUs.
        job.spec.resources.cpus = job.spec.resources.cpus.saturating_mul(tasks_per_node);
        if let (true, Some(GpuPart::Gpus(n))) = (self.gpus_per_task, &mut job.spec.resources.gpu) {
            *n = n.saturating_mul(tasks_per_node);
        }
        if let Some((n, span)) = self.total_gpus {
            let nodes = job.spec.resources.nodes.max(1);
            if !n.is_multiple_of(nodes) {
                return Err(at_span(
                    file,
                    text,
                    span,
                    format!(
                        "--gpus={n} over {nodes} nodes: gpuctl gives every node of a job the same GPUs; give a multiple of {nodes}, or --gpus-per-node"
                    ),
                ));
            }
            job.spec.resources.gpu = Some(GpuPart::Gpus(n / nodes));
        }
        if let Some(c) = self.cpus_per_gpu {
            // Per node: its GPUs' worth (a share counts as one GPU).
            let gpus = match &job.spec.resources.gpu {
                Some(GpuPart::Share(_)) => 1,
                _ => job.whole_gpus(),
            };
            job.spec.resources.cpus = c.saturating_mul(gpus.max(1));
        }
        if let Some(m) = self.mem_per_cpu {
            job.spec.resources.memory_bytes = m.saturating_mul(u64::from(job.spec.resources.cpus));
        }
        if let Some(m) = self.mem_per_gpu {
            // Per node: its GPUs' worth (a share counts as one GPU).
            let gpus = match &job.spec.resources.gpu {
                Some(GpuPart::Share(_)) => 1,
                _ => job.whole_gpus(),
            };
            job.spec.resources.memory_bytes = m.saturating_mul(u64::from(gpus.max(1)));
        }
        Ok(())
    }
}

fn default_name(file: &str) -> String {
    std::path::Path::new(file)
        .file_name()
        .map_or_else(|| "sbatch".into(), |s| s.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests;
