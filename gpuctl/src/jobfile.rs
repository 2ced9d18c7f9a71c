//! The job file (`job.toml`): parsing, validation with file/line/column errors, and
//! conversion to the wire `JobSpec`.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use gpuctl_core::record::{
    Dependency, DependencyKind, GpuPart, GpuShare, JobSpec, MigInstances, Resources,
};
use serde::Deserialize;
use toml::Spanned;

/// Job files larger than this are refused before parsing.
pub const MAX_JOB_FILE_BYTES: usize = 1 << 20;

/// A job file as written by the user. Unknown keys are errors.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    pub name: Option<Spanned<String>>,
    pub command: Option<Spanned<Vec<String>>>,
    pub script: Option<Spanned<String>>,
    pub workdir: Option<Spanned<String>>,
    pub stdout: Option<Spanned<String>>,
    pub stderr: Option<Spanned<String>>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub priority: i32,
    /// Quality of service name (weights come from the controller's config).
    pub qos: Option<Spanned<String>>,
    /// The account charged (`sbatch -A`).
    pub account: Option<Spanned<String>>,
    /// The partition (`sbatch -p`); none = the cluster's default.
    pub partition: Option<Spanned<String>>,
    /// The checkpoint signal before a preemption and its lead: "USR1@120".
    pub signal: Option<Spanned<String>>,
    /// A job array: "0-99%8".
    pub array: Option<Spanned<String>>,
    /// Requeue the job when its node fails (instead of ending it NODE_FAIL).
    #[serde(default)]
    pub requeue: bool,
    /// Shrink the request to what the last runs of this name needed (`--right-size`).
    #[serde(default)]
    pub right_size: bool,
    /// Share a GPU by what the last runs of this name used (`--colocate`).
    #[serde(default)]
    pub colocate: bool,
    /// "guaranteed" (the default: GPUs as asked, speed kept) or "opportunistic" (runs
    /// only in the idle of GPUs others hold, and yields: `--opportunistic`).
    pub class: Option<Spanned<String>>,
    /// Queue the job again after a failure, at most this many times.
    #[serde(default)]
    pub max_restarts: u32,
    /// Free text kept with the job (`sbatch --comment`; `squeue %k`).
    #[serde(default)]
    pub comment: String,
    /// Slurm's workload characterization key (`sbatch --wckey`; `squeue %w`).
    #[serde(default)]
    pub wckey: String,
    /// When to mail about the job: "BEGIN,END", "FAIL", "ALL"... (`--mail-type`).
    pub mail_type: Option<Spanned<String>>,
    /// Whom to mail (`--mail-user`; the job's user when not given).
    #[serde(default)]
    pub mail_user: String,
    /// Like sbatch: "afterok:12:13,afterany:14,afternotok:15".
    pub dependency: Option<Spanned<String>>,
    #[serde(default)]
    pub resources: ResourcesFile,
}

/// `gpus = 2` (whole GPUs) or `gpus = 0.25` (a share of one GPU).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum GpuCount {
    Whole(i64),
    Fraction(f64),
}

/// `gpu_model = "A100"` or `gpu_model = ["A100", "H100"]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourcesFile {
    pub gpus: Option<Spanned<GpuCount>>,
    /// GPU memory for a share, e.g. "10GiB".
    pub gpu_memory: Option<Spanned<String>>,
    /// Percent of the GPU's compute for a share.
    pub gpu_compute: Option<Spanned<u32>>,
    pub gpu_model: Option<Spanned<OneOrMany>>,
    /// A MIG profile, e.g. "3g.40gb".
    pub mig: Option<Spanned<String>>,
    pub mig_count: Option<Spanned<u32>>,
    /// Nodes for a multi-node (gang) job; gpus, cpus and memory are per node.
    pub nodes: Option<Spanned<u32>>,
    pub cpus: Option<Spanned<u32>>,
    /// e.g. "8GiB", "512MB".
    pub memory: Option<Spanned<String>>,
    /// humantime, e.g. "30m", "2h 30m".
    pub time_limit: Option<Spanned<String>>,
    /// Only these nodes (names, hostlists, globs), like sbatch -w.
    pub nodelist: Option<Spanned<OneOrMany>>,
    /// Never these nodes, like sbatch -x.
    pub exclude: Option<Spanned<OneOrMany>>,
    /// Node features, like sbatch -C: `"a100&nvlink"`, `"a100|h100"`.
    pub constraint: Option<Spanned<String>>,
    /// Processes on each node (sbatch --ntasks-per-node), each with its share of the
    /// node's GPUs; `cpus` then defaults to one a task.
    pub tasks_per_node: Option<Spanned<u32>>,
    /// The whole of each node (sbatch --exclusive): the controller sizes the request to
    /// the nodes the job may use.
    #[serde(default)]
    pub exclusive: bool,
}

/// A job file error, pointing into the file where it can.
#[derive(Debug, thiserror::Error)]
pub enum JobFileError {
    #[error("{file}: cannot read job file: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: job file is {size}; the limit is {MAX_JOB_FILE_BYTES} bytes")]
    TooLarge { file: String, size: String },
    #[error("{file}:{line}:{column}: {message}\n{snippet}")]
    At {
        file: String,
        line: usize,
        column: usize,
        message: String,
        snippet: String,
    },
    #[error("{file}: {message}")]
    Whole { file: String, message: String },
}

/// A validated job: the request as the controller reads it (core's `JobSpec`, the one
/// request type from the job file to the scheduler), and where it runs as written.
/// `user`, `uid`, `gid` and the absolute `workdir` are filled in by `into_spec`.
/// `Default` is a job of no program on one node with one CPU and no GPU: the job file
/// and `#SBATCH` parsers start from it and set what they read.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub spec: JobSpec,
    /// The working directory as written (relative to where `gpuctl` runs); none: there.
    pub workdir: Option<PathBuf>,
}

impl Default for Job {
    fn default() -> Job {
        Job {
            spec: JobSpec {
                resources: Resources {
                    cpus: 1,
                    nodes: 1,
                    tasks_per_node: 1,
                    ..Resources::default()
                },
                ..JobSpec::default()
            },
            workdir: None,
        }
    }
}

impl Job {
    /// The whole GPUs asked for on each node (0 for a share, MIG or none).
    pub fn whole_gpus(&self) -> u32 {
        match self.spec.resources.gpu {
            Some(GpuPart::Gpus(n)) => n,
            _ => 0,
        }
    }
}

/// The GPU part of `gpus = N` or a share of `milli` milli-GPUs (and `memory_mib`, 0:
/// none given): a share when it has a part, else whole GPUs, else none.
pub fn gpu_request(gpus: u32, milli: u32, memory_mib: u64) -> Option<GpuPart> {
    if milli > 0 || memory_mib > 0 {
        Some(GpuPart::Share(GpuShare {
            compute_milli: milli,
            memory_mib: (memory_mib > 0).then_some(memory_mib),
        }))
    } else {
        (gpus > 0).then_some(GpuPart::Gpus(gpus))
    }
}

/// Reads and validates a job file.
pub fn load(path: &Path) -> Result<Job, JobFileError> {
    load_any(path).map(|(job, _)| job)
}

/// Reads and validates a job file: TOML, or a Slurm batch script (`#!` first, or
/// `#SBATCH` lines), with what a batch script asks for besides the job.
pub fn load_any(path: &Path) -> Result<(Job, crate::sbatch::Extra), JobFileError> {
    use std::io::Read as _;
    // `-`: the job from standard input (`gpuctl submit - < job.sh`, as `sbatch < job.sh`).
    let stdin = path == Path::new("-");
    let file = if stdin {
        STDIN_LABEL.to_string()
    } else {
        path.display().to_string()
    };
    let read_err = |source| JobFileError::Read {
        file: file.clone(),
        source,
    };
    // At most one byte over the limit is read: `/dev/zero` or a huge file given by
    // mistake is refused, not read into memory.
    let mut bytes = Vec::new();
    let limit = MAX_JOB_FILE_BYTES as u64 + 1;
    if stdin {
        std::io::stdin()
            .lock()
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
    } else {
        std::fs::File::open(path)
            .and_then(|f| f.take(limit).read_to_end(&mut bytes))
            .map_err(read_err)?;
    }
    if bytes.len() > MAX_JOB_FILE_BYTES {
        return Err(JobFileError::TooLarge {
            size: match std::fs::metadata(path) {
                Ok(m) if m.is_file() => format!("{} bytes", m.len()),
                _ => format!("over {MAX_JOB_FILE_BYTES} bytes"),
            },
            file,
        });
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        read_err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        ))
    })?;
    if crate::sbatch::is_batch_script(&text) {
        let (mut job, extra) = crate::sbatch::parse(&file, &text)?;
        // A script from standard input is named as sbatch names it.
        if stdin && job.spec.name == STDIN_LABEL {
            job.spec.name = "sbatch".into();
        }
        return Ok((job, extra));
    }
    Ok((parse(&file, &text)?, crate::sbatch::Extra::default()))
}

/// What errors call a job read from standard input.
const STDIN_LABEL: &str = "stdin";

/// Parses and validates job file text; `file` names it in errors.
pub fn parse(file: &str, text: &str) -> Result<Job, JobFileError> {
    if text.len() > MAX_JOB_FILE_BYTES {
        return Err(JobFileError::TooLarge {
            file: file.to_string(),
            size: format!("{} bytes", text.len()),
        });
    }
    let src = Src { file, text };
    let at = |span: Range<usize>, message: String| src.at(span, message);
    let raw: JobFile = toml::from_str(text).map_err(|e| match e.span() {
        Some(span) => at(span, e.message().to_string()),
        None => JobFileError::Whole {
            file: file.to_string(),
            message: e.message().to_string(),
        },
    })?;

    let (command, script) = command_part(&src, raw.command, raw.script)?;

    let name = match raw.name {
        Some(n) => {
            let v = n.get_ref();
            if v.is_empty() || v.len() > 128 || v.chars().any(char::is_control) {
                return Err(at(
                    n.span(),
                    "`name` must be 1 to 128 printable characters".into(),
                ));
            }
            n.into_inner()
        }
        None => default_name(&command, file),
    };

    for key in raw.env.keys() {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(JobFileError::Whole {
                file: file.to_string(),
                message: format!("env: `{key}` is not a valid environment variable name"),
            });
        }
    }

    let res = raw.resources;
    let (cpus, memory_bytes, time_limit) = host_part(&src, &res)?;
    let path_field = |v: Option<Spanned<String>>| -> Result<Option<String>, JobFileError> {
        match v {
            Some(p) if p.get_ref().is_empty() || p.get_ref().contains('\0') => {
                Err(at(p.span(), "path must not be empty".into()))
            }
            Some(p) => Ok(Some(p.into_inner())),
            None => Ok(None),
        }
    };

    let nodelist = node_list(&src, res.nodelist.as_ref(), "nodelist")?;
    let exclude = node_list(&src, res.exclude.as_ref(), "exclude")?;
    let constraint = match &res.constraint {
        Some(c) => gpuctl_sched::features::checked(c.get_ref()).map_err(|m| at(c.span(), m))?,
        None => String::new(),
    };
    let tasks = res.tasks_per_node.clone();
    let exclusive = res.exclusive;
    let cpus = match (&tasks, &res.cpus) {
        (Some(t), None) => cpus.max(*t.get_ref()),
        _ => cpus,
    };
    let gpu = gpu_part(&src, res)?;
    let tasks_per_node = tasks_part(&src, tasks, &gpu, cpus)?;
    // A name of the controller's config (QoS, account, partition): 1 to 64 characters.
    let config_name = |v: Option<Spanned<String>>, key: &str| match v {
        Some(v) if v.get_ref().is_empty() || v.get_ref().len() > 64 => {
            Err(at(v.span(), format!("`{key}` must be 1 to 64 characters")))
        }
        Some(v) => Ok(v.into_inner()),
        None => Ok(String::new()),
    };
    let qos = config_name(raw.qos, "qos")?;
    let account = config_name(raw.account, "account")?;
    let partition = config_name(raw.partition, "partition")?;
    let opportunistic = class(&src, raw.class.as_ref())?;
    let signal = match raw.signal {
        Some(sig) => {
            gpuctl_proto::convert::parse_signal_spec(sig.get_ref())
                .map_err(|m| at(sig.span(), m))?;
            sig.into_inner()
        }
        None => String::new(),
    };
    let mail_type = match raw.mail_type {
        Some(t) => mail_types(t.get_ref()).map_err(|m| at(t.span(), m))?,
        None => String::new(),
    };
    let array = match raw.array {
        Some(a) => {
            gpuctl_sched::array::parse(a.get_ref(), usize::MAX).map_err(|m| at(a.span(), m))?;
            a.into_inner()
        }
        None => String::new(),
    };
    let dependencies = match &raw.dependency {
        Some(d) => parse_dependency(d.get_ref()).map_err(|m| at(d.span(), m))?,
        None => Vec::new(),
    };
    let resources = Resources {
        gpu: gpu.request(),
        cpus,
        memory_bytes,
        time_limit_secs: time_limit.map_or(0, |d| d.as_secs()),
        gpu_models: gpu.gpu_models,
        nodes: gpu.nodes,
        nodelist,
        exclude,
        constraint,
        tasks_per_node,
        exclusive,
        ..Resources::default()
    };
    Ok(Job {
        spec: JobSpec {
            dependencies,
            name,
            command,
            script,
            stdout: path_field(raw.stdout)?.unwrap_or_default(),
            stderr: path_field(raw.stderr)?.unwrap_or_default(),
            env: raw.env.into_iter().collect(),
            priority: raw.priority,
            qos,
            account,
            partition,
            signal,
            array,
            requeue: raw.requeue,
            right_size: raw.right_size,
            colocate: raw.colocate,
            opportunistic,
            max_restarts: raw.max_restarts,
            comment: raw.comment,
            wckey: raw.wckey,
            mail_type,
            mail_user: raw.mail_user,
            resources,
            ..JobSpec::default()
        },
        workdir: path_field(raw.workdir)?.map(PathBuf::from),
    })
}

/// What the job runs: exactly one of `command` (a program name at least) and a
/// non-empty `script`.
fn command_part(
    src: &Src<'_>,
    command: Option<Spanned<Vec<String>>>,
    script: Option<Spanned<String>>,
) -> Result<(Vec<String>, String), JobFileError> {
    match (command, script) {
        (Some(_), Some(s)) => Err(src.at(
            s.span(),
            "set either `command` or `script`, not both".into(),
        )),
        (None, None) => Err(JobFileError::Whole {
            file: src.file.to_string(),
            message: "the job has nothing to run: set `command = [\"prog\", \"arg\"]` or `script = \"...\"`".into(),
        }),
        (Some(c), None) => {
            if c.get_ref().is_empty() || c.get_ref()[0].is_empty() {
                let why = "`command` needs at least a program name".into();
                return Err(src.at(c.span(), why));
            }
            Ok((c.into_inner(), String::new()))
        }
        (None, Some(s)) => {
            if s.get_ref().trim().is_empty() {
                return Err(src.at(s.span(), "`script` is empty".into()));
            }
            Ok((Vec::new(), s.into_inner()))
        }
    }
}

/// `tasks_per_node`: at least 1, and what the node's GPUs and CPUs split evenly into
/// (`gpuctl_core::request::check_tasks`); 1 when not given.
fn tasks_part(
    src: &Src<'_>,
    tasks: Option<Spanned<u32>>,
    gpu: &GpuFields,
    cpus: u32,
) -> Result<u32, JobFileError> {
    Ok(match tasks {
        Some(t) if *t.get_ref() == 0 => {
            return Err(src.at(t.span(), "`tasks_per_node` must be at least 1".into()));
        }
        Some(t) => {
            let asked = Resources {
                gpu: gpu.request(),
                cpus,
                tasks_per_node: *t.get_ref(),
                ..Resources::default()
            };
            gpuctl_core::request::check_tasks(&asked).map_err(|m| src.at(t.span(), m))?;
            *t.get_ref()
        }
        None => 1,
    })
}

/// A job file's text, for errors that point into it.
struct Src<'a> {
    file: &'a str,
    text: &'a str,
}

impl Src<'_> {
    fn at(&self, span: Range<usize>, message: String) -> JobFileError {
        at_span(self.file, self.text, span, message)
    }
}

/// `cpus`, `memory` and `time_limit` of `[resources]`.
fn host_part(
    src: &Src<'_>,
    res: &ResourcesFile,
) -> Result<(u32, u64, Option<std::time::Duration>), JobFileError> {
    let at = |span: Range<usize>, message: String| src.at(span, message);
    let cpus = match &res.cpus {
        Some(c) if *c.get_ref() == 0 => {
            return Err(at(c.span(), "`cpus` must be at least 1".into()));
        }
        Some(c) => *c.get_ref(),
        None => 1,
    };
    let memory_bytes = match &res.memory {
        Some(m) => match m.get_ref().trim().parse::<bytesize::ByteSize>() {
            Ok(b) if b.as_u64() > 0 => b.as_u64(),
            Ok(_) => return Err(at(m.span(), "`memory` must be more than 0".into())),
            Err(e) => {
                return Err(at(
                    m.span(),
                    format!("`memory`: {e} (write e.g. \"8GiB\" or \"512MiB\")"),
                ));
            }
        },
        None => 0,
    };
    let time_limit = match &res.time_limit {
        Some(t) => match humantime::parse_duration(t.get_ref().trim()) {
            Ok(d) if d.as_secs() >= 1 => Some(d),
            Ok(_) => {
                return Err(at(
                    t.span(),
                    format!("`time_limit`: {}", crate::sbatch::ZERO_TIME),
                ));
            }
            Err(e) => {
                return Err(at(
                    t.span(),
                    format!("`time_limit`: {e} (write e.g. \"30m\" or \"2h 30m\")"),
                ));
            }
        },
        None => None,
    };

    Ok((cpus, memory_bytes, time_limit))
}

/// `nodelist` or `exclude`: a string (`"n[1-3],m5"`, split at its top-level commas) or a
/// list of patterns, each a node pattern the controller would take.
fn node_list(
    src: &Src<'_>,
    v: Option<&Spanned<OneOrMany>>,
    key: &str,
) -> Result<Vec<String>, JobFileError> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let list = match v.get_ref() {
        OneOrMany::One(s) => gpuctl_sched::hostlist::split_list(s),
        OneOrMany::Many(l) => l.clone(),
    };
    if list.is_empty() {
        return Err(src.at(v.span(), format!("`{key}` names no node")));
    }
    check_node_list(&list, key).map_err(|m| src.at(v.span(), m))?;
    Ok(list)
}

/// What the controller would say of a node list (`convert::check_node_patterns`).
pub fn check_node_list(list: &[String], key: &str) -> Result<(), String> {
    gpuctl_proto::convert::check_node_patterns(key, list).map_err(|e| e.to_string())
}

/// The GPU fields of `[resources]` (whole GPUs, a share, or MIG) and `nodes`.
struct GpuFields {
    gpus: u32,
    gpu_milli: u32,
    gpu_memory_mib: u64,
    gpu_models: Vec<String>,
    mig_profile: String,
    mig_count: u32,
    nodes: u32,
}

impl GpuFields {
    /// The request's GPU part: MIG instances, else a share, else whole GPUs.
    fn request(&self) -> Option<GpuPart> {
        if self.mig_profile.is_empty() {
            gpu_request(self.gpus, self.gpu_milli, self.gpu_memory_mib)
        } else {
            Some(GpuPart::Mig(MigInstances {
                profile: self.mig_profile.clone(),
                count: self.mig_count.max(1),
            }))
        }
    }
}

fn gpu_part(src: &Src<'_>, res: ResourcesFile) -> Result<GpuFields, JobFileError> {
    let at = |span: Range<usize>, message: String| src.at(span, message);
    let (gpus, mut gpu_milli) = match res.gpus {
        None => (0, 0),
        Some(g) => match *g.get_ref() {
            GpuCount::Whole(n) if (0..=1024).contains(&n) => (n as u32, 0),
            GpuCount::Whole(_) => {
                return Err(at(g.span(), "`gpus` must be between 0 and 1024".into()));
            }
            GpuCount::Fraction(f) if f > 0.0 && f < 1.0 => {
                let milli = (f * 1000.0).round() as u32;
                if milli == 0 {
                    return Err(at(g.span(), "a GPU share must be at least 0.001".into()));
                }
                (0, milli)
            }
            GpuCount::Fraction(f) if f >= 1.0 && f.fract() == 0.0 && f <= 1024.0 => (f as u32, 0),
            GpuCount::Fraction(_) => {
                return Err(at(
                    g.span(),
                    "`gpus` is a whole number, or a share below 1 (like 0.25)".into(),
                ));
            }
        },
    };
    if let Some(c) = res.gpu_compute {
        if !(1..=100).contains(c.get_ref()) {
            return Err(at(
                c.span(),
                "`gpu_compute` is a percentage from 1 to 100".into(),
            ));
        }
        if gpus > 0 {
            return Err(at(
                c.span(),
                "`gpu_compute` is for a share; it does not go with whole `gpus`".into(),
            ));
        }
        gpu_milli = c.get_ref() * 10;
    }
    let gpu_memory_mib = match res.gpu_memory {
        None => 0,
        Some(m) => {
            if gpus > 0 {
                return Err(at(
                    m.span(),
                    "`gpu_memory` is for a share; it does not go with whole `gpus`".into(),
                ));
            }
            match m.get_ref().trim().parse::<bytesize::ByteSize>() {
                Ok(b) if b.as_u64() >= 1 << 20 => b.as_u64().div_ceil(1 << 20),
                Ok(_) => return Err(at(m.span(), "`gpu_memory` must be at least 1MiB".into())),
                Err(e) => {
                    return Err(at(
                        m.span(),
                        format!("`gpu_memory`: {e} (write e.g. \"10GiB\")"),
                    ));
                }
            }
        }
    };
    let gpu_models = match res.gpu_model {
        None => Vec::new(),
        Some(m) => {
            let v = match m.get_ref() {
                OneOrMany::One(s) => vec![s.clone()],
                OneOrMany::Many(v) => v.clone(),
            };
            if v.is_empty() || v.iter().any(|s| s.trim().is_empty()) {
                return Err(at(m.span(), "`gpu_model` names must not be empty".into()));
            }
            v
        }
    };
    let (mig_profile, mig_count) = match (res.mig, res.mig_count) {
        (None, Some(c)) => {
            return Err(at(c.span(), "`mig_count` needs `mig = \"PROFILE\"`".into()));
        }
        (None, None) => (String::new(), 0),
        (Some(p), c) => {
            let ok = p
                .get_ref()
                .split_once("g.")
                .is_some_and(|(g, m)| g.parse::<u32>().is_ok() && m.ends_with("gb"));
            if !ok {
                return Err(at(
                    p.span(),
                    "`mig` is a MIG profile like \"3g.40gb\"".into(),
                ));
            }
            if gpus > 0 || gpu_milli > 0 || gpu_memory_mib > 0 {
                return Err(at(
                    p.span(),
                    "`mig` does not go with `gpus`, `gpu_memory` or `gpu_compute`".into(),
                ));
            }
            let count = match c {
                Some(c) if *c.get_ref() == 0 => {
                    return Err(at(c.span(), "`mig_count` must be at least 1".into()));
                }
                Some(c) => c.into_inner(),
                None => 1,
            };
            (p.into_inner(), count)
        }
    };
    let nodes = match res.nodes {
        None => 1,
        Some(n) if *n.get_ref() == 0 || *n.get_ref() > 1024 => {
            return Err(at(n.span(), "`nodes` must be between 1 and 1024".into()));
        }
        Some(n)
            if *n.get_ref() > 1
                && (gpu_milli > 0 || gpu_memory_mib > 0 || !mig_profile.is_empty()) =>
        {
            return Err(at(
                n.span(),
                "multi-node jobs take whole GPUs (no shares or MIG)".into(),
            ));
        }
        Some(n) => n.into_inner(),
    };
    Ok(GpuFields {
        gpus,
        gpu_milli,
        gpu_memory_mib,
        gpu_models,
        mig_profile,
        mig_count,
        nodes,
    })
}

/// `afterok:12:13,afterany:14` -> [(AfterOk, 12), (AfterOk, 13), (AfterAny, 14)];
/// `singleton` -> (Singleton, 0).
pub fn parse_dependency(text: &str) -> Result<Vec<Dependency>, String> {
    use DependencyKind as Kind;
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part == "singleton" {
            let one = Dependency {
                kind: Kind::Singleton,
                job_id: 0,
            };
            if !out.contains(&one) {
                out.push(one);
            }
            continue;
        }
        let mut it = part.split(':');
        let kind = match it.next().unwrap_or("") {
            "afterok" => Kind::AfterOk,
            "afterany" => Kind::AfterAny,
            "afternotok" => Kind::AfterNotOk,
            other => {
                return Err(format!(
                    "`dependency`: {other:?} is not afterok, afterany, afternotok or singleton (write e.g. \"afterok:12:13,afterany:14\")"
                ));
            }
        };
        let mut any = false;
        for id in it {
            let id: u64 = id
                .trim()
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("`dependency`: {id:?} is not a job id"))?;
            out.push(Dependency { kind, job_id: id });
            any = true;
        }
        if !any {
            return Err(format!(
                "`dependency`: {part:?} names no job (afterok:ID[:ID...])"
            ));
        }
    }
    if out.is_empty() {
        return Err("`dependency` is empty".into());
    }
    Ok(out)
}

fn default_name(command: &[String], file: &str) -> String {
    if let Some(prog) = command.first() {
        return Path::new(prog)
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| prog.clone());
    }
    Path::new(file)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "script".into())
}

/// The offending line with a caret under the span: at most `SNIPPET` characters of it,
/// around the column (a 400 KB line is not echoed whole), control characters escaped.
const SNIPPET: usize = 100;

fn snippet(line: &str, column: usize, width: usize) -> String {
    let chars: Vec<char> = line.chars().collect();
    let from = if chars.len() <= SNIPPET {
        0
    } else {
        (column - 1)
            .saturating_sub(SNIPPET / 3)
            .min(chars.len() - SNIPPET)
    };
    let to = (from + SNIPPET).min(chars.len());
    let shown: String = chars[from..to]
        .iter()
        .map(|&c| if c.is_control() { '?' } else { c })
        .collect();
    let pre = if from > 0 { "..." } else { "" };
    let post = if to < chars.len() { "..." } else { "" };
    let caret_at = pre.len() + (column - 1).saturating_sub(from);
    let width = width.min(to.saturating_sub(column - 1).max(1));
    format!(
        "  | {pre}{shown}{post}\n  | {}{}",
        " ".repeat(caret_at),
        "^".repeat(width)
    )
}

/// The job file's `class`: whether the job is opportunistic.
fn class(src: &Src<'_>, class: Option<&Spanned<String>>) -> Result<bool, JobFileError> {
    match class.map(|c| (c.get_ref().as_str(), c.span())) {
        None | Some(("guaranteed", _)) => Ok(false),
        Some(("opportunistic", _)) => Ok(true),
        Some((other, span)) => Err(src.at(
            span,
            format!("class {other:?}: \"guaranteed\" or \"opportunistic\""),
        )),
    }
}

/// `--mail-type` / `mail_type`: Slurm's names, any case, comma-separated; kept in
/// upper case (`BEGIN,END`).
pub fn mail_types(v: &str) -> Result<String, String> {
    let types: Vec<String> = v
        .split(',')
        .map(|t| t.trim().to_ascii_uppercase())
        .collect();
    match types
        .iter()
        .find(|t| !gpuctl_core::validate::MAIL_TYPES.contains(&t.as_str()))
    {
        Some(bad) => Err(format!(
            "mail type {bad:?} is not one of Slurm's: {}",
            gpuctl_core::validate::MAIL_TYPES.join(", ")
        )),
        None => Ok(types.join(",")),
    }
}

pub(crate) fn at_span(file: &str, text: &str, span: Range<usize>, message: String) -> JobFileError {
    let start = span.start.min(text.len());
    let before = &text[..start];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = text[line_start..start].chars().count() + 1;
    let line_text = text[line_start..].lines().next().unwrap_or("");
    let width = text[start..span.end.min(text.len())]
        .lines()
        .next()
        .map_or(1, |s| s.chars().count().max(1));
    let snippet = snippet(line_text, column, width);
    JobFileError::At {
        file: file.to_string(),
        line,
        column,
        message: message.trim_end().to_string(),
        snippet,
    }
}

impl Job {
    /// The request to send, with the client-side defaults filled in: the absolute
    /// working directory and who asks.
    pub fn into_spec(self, cwd: &Path, user: &str, uid: u32, gid: u32) -> JobSpec {
        let workdir = match self.workdir {
            Some(w) if w.is_absolute() => w,
            Some(w) => cwd.join(w),
            None => cwd.to_path_buf(),
        };
        JobSpec {
            workdir: workdir.display().to_string(),
            user: user.to_string(),
            uid,
            gid,
            ..self.spec
        }
    }
}

#[cfg(test)]
mod tests;
