//! `gpuctl submit`: a job file (TOML or a Slurm batch script) or `--wrap "cmd"`, with
//! command-line options that override what the file asks for (like sbatch's), turned
//! into the wire `JobSpec`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuctl_core::record::{GpuPart, JobSpec};
use gpuctl_proto as pb;

use crate::jobfile::{self, Job};
use crate::sbatch::{self, Extra};

/// `gpuctl submit`'s arguments.
#[derive(clap::Args, Default)]
pub struct SubmitArgs {
    /// Job files: TOML (job.toml), or shell scripts with #SBATCH lines. Several files
    /// are all read and checked first (nothing is sent if one is bad), then queued in
    /// order on one connection, each as its own job.
    #[arg(
        required_unless_present = "wrap",
        conflicts_with = "wrap",
        value_name = "FILE"
    )]
    pub files: Vec<PathBuf>,
    /// Run this shell command as the job, without a file (like sbatch --wrap).
    #[arg(long)]
    pub wrap: Option<String>,
    #[arg(long)]
    pub json: bool,
    /// Run the job as this user (admins only).
    #[arg(long)]
    pub user: Option<String>,
    /// Pass this shell's environment to the job (like sbatch --export): ALL, NONE
    /// (the default: the job gets a login-like environment and its file's `env`),
    /// or a comma-separated list of NAME or NAME=VALUE. The job file's `env` wins.
    #[arg(long, value_name = "ALL|NONE|NAME[=VALUE],...")]
    pub export: Option<String>,
    #[command(flatten)]
    pub sizes: Sizes,
    /// Nodes of a multi-node job.
    #[arg(short = 'N', long)]
    pub nodes: Option<u32>,
    /// Output file (overrides the file's).
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// A job array: one job per task, e.g. `0-99%8` (ranges, steps `0-99:10`, lists
    /// `1,5,9`; `%N`: at most N tasks at once). Tasks see GPUCTL_ARRAY_JOB_ID and
    /// GPUCTL_ARRAY_TASK_ID; output paths may use %A and %a.
    #[arg(short = 'a', long)]
    pub array: Option<String>,
    /// The whole of each node it runs on (like sbatch --exclusive): the controller sizes
    /// the request to the nodes the job may use, which must be alike.
    #[arg(long)]
    pub exclusive: bool,
    /// Dependencies (replace the file's): afterok:12:13,afterany:14, singleton.
    #[arg(short = 'd', long)]
    pub dependency: Option<String>,
    /// Shrink the request to what your last runs of this job name needed, with a
    /// margin (GPU share, GPU memory, time limit, CPUs, memory); says what changed.
    #[arg(long)]
    pub right_size: bool,
    /// Share a GPU with others by what your last runs of this job name used (their
    /// busy share and GPU memory peak, with a margin) rather than by the request; GPU
    /// memory becomes a hard limit. One GPU or a share; says what changed.
    #[arg(long)]
    pub colocate: bool,
    /// The opportunistic class: run only in the idle of GPUs that other jobs hold
    /// (their measured busy share low), with the room their memory peak leaves as a
    /// hard GPU memory limit; the job gets its checkpoint signal and is requeued when
    /// the holders need their GPU back. Give it --signal and --requeue to keep work.
    #[arg(long)]
    pub opportunistic: bool,
    /// Not before this time (sbatch --begin): now+2hours, 16:00, midnight,
    /// 2026-12-24T08:00 (this machine's time zone).
    #[arg(long)]
    pub begin: Option<String>,
    /// Queue the job held: it starts only after `gpuctl release` (sbatch -H).
    #[arg(short = 'H', long)]
    pub hold: bool,
    /// Print only the job id (sbatch --parsable), for `jid=$(gpuctl submit ...)`.
    #[arg(long, conflicts_with = "json")]
    pub parsable: bool,
}

/// What a job asks for, on the command line of `submit` (over its file's), `alloc`
/// and `run` (an allocation's): sbatch's, salloc's and srun's options alike.
#[derive(clap::Args, Default, Debug, Clone)]
pub struct Sizes {
    /// Job name (for `submit`, over the file's; like the others here).
    #[arg(short = 'J', long = "job-name")]
    pub name: Option<String>,
    /// Time limit: a Slurm time (M, H:M:S, D-H:M, ...) or e.g. "2h 30m" (for `gpuctl
    /// run`, the step's own too).
    #[arg(short = 't', long)]
    pub time: Option<String>,
    /// GPUs, as sbatch -G: N or TYPE:N in all, split over the nodes (a number below 1
    /// is a share of one GPU).
    #[arg(short = 'G', long)]
    pub gpus: Option<String>,
    /// CPUs per node.
    #[arg(short = 'c', long = "cpus-per-task")]
    pub cpus: Option<u32>,
    /// Host memory per node, e.g. 16G (Slurm units, default M).
    #[arg(long)]
    pub mem: Option<String>,
    /// The partition (like sbatch -p).
    #[arg(short = 'p', long)]
    pub partition: Option<String>,
    /// Only these nodes: names, hostlists (gpu[01-04]) or globs, comma-separated (like
    /// sbatch -w).
    #[arg(short = 'w', long)]
    pub nodelist: Option<String>,
    /// Never these nodes (like sbatch -x).
    #[arg(short = 'x', long)]
    pub exclude: Option<String>,
    /// Only nodes with these features (`gpud --features`): `a100&nvlink` all of them,
    /// `a100|h100` any (like sbatch -C).
    #[arg(short = 'C', long)]
    pub constraint: Option<String>,
    /// The QoS.
    #[arg(short = 'q', long)]
    pub qos: Option<String>,
    /// The account charged.
    #[arg(short = 'A', long)]
    pub account: Option<String>,
}

impl Sizes {
    /// The options given that size a job, by their flags (`-t` aside: it times a
    /// step too).
    pub fn given(&self) -> Vec<&'static str> {
        let o = |set: bool, f: &'static str| set.then_some(f);
        [
            o(self.gpus.is_some(), "-G"),
            o(self.partition.is_some(), "-p"),
            o(self.cpus.is_some(), "-c"),
            o(self.mem.is_some(), "--mem"),
            o(self.name.is_some(), "-J"),
            o(self.qos.is_some(), "-q"),
            o(self.account.is_some(), "-A"),
            o(self.nodelist.is_some(), "-w"),
            o(self.exclude.is_some(), "-x"),
            o(self.constraint.is_some(), "-C"),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Of `given`, those that size only an allocation: a step within a job takes its
    /// GPUs (`-G`), CPUs per task (`-c`) and name (`-J`) from them, not the rest.
    pub fn allocation_only(&self) -> Vec<&'static str> {
        (self.given().into_iter())
            .filter(|f| !matches!(*f, "-G" | "-c" | "-J"))
            .collect()
    }
}

/// One job to submit: where it came from, its spec, and whether it is queued held.
#[derive(Debug)]
pub struct Submission {
    pub file: String,
    pub spec: pb::JobSpec,
    pub hold: bool,
}

impl SubmitArgs {
    /// Every job asked for, in order, with what errors and messages call it (its file,
    /// or `--wrap`), read and overridden as wire specs; warnings go to stderr. All files
    /// are read before any answer: the error names every bad one.
    pub fn specs(&self, cwd: &Path) -> Result<Vec<Submission>, String> {
        // A bad `--export` is said once, not once a file.
        if let Some(e) = &self.export {
            exported_env(e, std::iter::empty())?;
        }
        if self.files.is_empty() {
            let (job, extra) = match &self.wrap {
                Some(cmd) => sbatch::parse("wrap", &format!("#!/bin/sh\n{cmd}\n"))
                    .map(|(mut j, e)| {
                        j.spec.name = "wrap".into();
                        (j, e)
                    })
                    .map_err(|e| e.to_string())?,
                None => return Err("give a job file or --wrap \"command\"".into()),
            };
            let hold = self.hold || extra.hold;
            let spec = self.spec("--wrap", job, extra, cwd)??;
            return Ok(vec![Submission {
                file: "--wrap".to_string(),
                spec,
                hold,
            }]);
        }
        let mut specs = Vec::with_capacity(self.files.len());
        let mut errors = Vec::new();
        for f in &self.files {
            let label = f.display().to_string();
            let (spec, hold) = match jobfile::load_any(f) {
                Ok((job, extra)) => {
                    let hold = self.hold || extra.hold;
                    (self.spec(&label, job, extra, cwd)?, hold)
                }
                Err(e) => (Err(e.to_string()), false),
            };
            match spec {
                Ok(spec) => specs.push(Submission {
                    file: label,
                    spec,
                    hold,
                }),
                Err(e) => errors.push(e),
            }
        }
        match errors.len() {
            0 => Ok(specs),
            _ if self.files.len() == 1 => Err(errors.remove(0)),
            n => Err(format!(
                "{}\nnothing submitted: {n} of {} files have errors",
                errors.join("\n"),
                self.files.len()
            )),
        }
    }

    /// One job (called `label`), overridden by the command line, as the wire spec. The
    /// outer error is the command line's (the same for every file), the inner the
    /// job's own.
    pub(crate) fn spec(
        &self,
        label: &str,
        mut job: Job,
        extra: Extra,
        cwd: &Path,
    ) -> Result<Result<pb::JobSpec, String>, String> {
        for w in &extra.warnings {
            eprintln!("gpuctl: warning: {label}: {w}");
        }
        self.apply(&mut job)?;
        // The controller runs the job as the authenticated caller; naming a user
        // (admins only) asks for another.
        let mut spec = job.into_spec(cwd, self.user.as_deref().unwrap_or(""), 0, 0);
        Ok(self
            .export_env(&extra, &mut spec)
            // The controller's own rules for a request's shape, before anything is sent.
            .and_then(|()| {
                gpuctl_core::request::checked_request(&spec.resources).map_err(|e| e.to_string())
            })
            .map(|_| pb::JobSpec::from(&spec))
            .map_err(|e| format!("{label}: {e}")))
    }

    /// The command line's options win over the file's.
    fn apply(&self, job: &mut Job) -> Result<(), String> {
        if let Some(n) = &self.sizes.name {
            job.spec.name = n.clone();
        }
        if let Some(t) = &self.sizes.time {
            job.spec.resources.time_limit_secs = time_limit(t)?.as_secs();
        }
        if let Some(g) = &self.sizes.gpus {
            let (n, model, milli) = sbatch::gpus_of(g, false)?;
            job.spec.resources.gpu = jobfile::gpu_request(n, milli, 0);
            job.spec.resources.gpu_models = model.into_iter().collect();
        }
        if let Some(c) = self.sizes.cpus {
            job.spec.resources.cpus = c;
        }
        if let Some(b) = &self.begin {
            job.spec.begin_ms = sbatch::begin_time(b, &jiff::Zoned::now())?;
        }
        if let Some(a) = &self.array {
            gpuctl_sched::array::parse(a, usize::MAX).map_err(|e| format!("--array: {e}"))?;
            job.spec.array = a.clone();
        }
        if let Some(p) = &self.sizes.partition {
            job.spec.partition = p.clone();
        }
        for (flag, v, to) in [
            (
                "nodelist",
                &self.sizes.nodelist,
                &mut job.spec.resources.nodelist,
            ),
            (
                "exclude",
                &self.sizes.exclude,
                &mut job.spec.resources.exclude,
            ),
        ] {
            if let Some(v) = v {
                let list = gpuctl_sched::hostlist::split_list(v);
                crate::jobfile::check_node_list(&list, flag)
                    .map_err(|e| format!("--{flag}: {e}"))?;
                *to = list;
            }
        }
        if let Some(c) = &self.sizes.constraint {
            job.spec.resources.constraint =
                gpuctl_sched::features::checked(c).map_err(|e| format!("--constraint: {e}"))?;
        }
        job.spec.resources.exclusive |= self.exclusive;
        if let Some(q) = &self.sizes.qos {
            job.spec.qos = q.clone();
        }
        if let Some(a) = &self.sizes.account {
            job.spec.account = a.clone();
        }
        if let Some(d) = &self.dependency {
            job.spec.dependencies = jobfile::parse_dependency(d)?;
        }
        if let Some(m) = &self.sizes.mem {
            job.spec.resources.memory_bytes = sbatch::slurm_memory(m)?;
        }
        if let Some(n) = self.nodes {
            job.spec.resources.nodes = n;
        }
        let nodes = job.spec.resources.nodes.max(1);
        if let (Some(_), Some(GpuPart::Gpus(n))) = (&self.sizes.gpus, &mut job.spec.resources.gpu)
            && *n > 0
        {
            if !n.is_multiple_of(nodes) {
                return Err(format!(
                    "-G {n} over {nodes} nodes: every node of a job gets the same GPUs; give a multiple of {nodes}"
                ));
            }
            *n /= nodes;
        }
        if let Some(o) = &self.output {
            job.spec.stdout = o.clone();
        }
        job.spec.right_size |= self.right_size;
        job.spec.colocate |= self.colocate;
        job.spec.opportunistic |= self.opportunistic;
        Ok(())
    }

    /// `--export` (the command line's wins over a script's; a batch script's default is
    /// ALL, as sbatch's, a TOML job file's NONE); the job's own env wins.
    fn export_env(&self, extra: &Extra, spec: &mut JobSpec) -> Result<(), String> {
        let asked = self.export.as_ref().or(extra.export.as_ref());
        let export = asked.map(String::as_str).or(extra.batch.then_some("ALL"));
        if let Some(e) = export {
            for (k, v) in exported_env(e, std::env::vars_os())? {
                spec.env.entry(k).or_insert(v);
            }
        }
        Ok(())
    }
}

/// A time limit on the command line: Slurm's formats, or humantime ("2h 30m").
pub(crate) fn time_limit(t: &str) -> Result<Duration, String> {
    match sbatch::slurm_time(t) {
        Err(e) if e == sbatch::ZERO_TIME => Err(e),
        Ok(d) => Ok(d),
        Err(slurm) => match humantime::parse_duration(t) {
            Ok(d) if d.is_zero() => Err(sbatch::ZERO_TIME.into()),
            Ok(d) => Ok(d),
            Err(_) => Err(format!(
                "{slurm}, and not a duration like \"2h 30m\" either"
            )),
        },
    }
}

/// Variables that say which job, rank and GPUs a process is: ALL never passes the
/// submitting shell's (a job submitted from inside another would take that one's), the
/// agent sets the new job's.
fn job_identity(name: &str) -> bool {
    name.starts_with("SLURM_")
        || name.starts_with("GPUCTL_")
        || matches!(
            name,
            "MASTER_ADDR"
                | "MASTER_PORT"
                | "RANK"
                | "LOCAL_RANK"
                | "NODE_RANK"
                | "WORLD_SIZE"
                | "LOCAL_WORLD_SIZE"
                | "CUDA_VISIBLE_DEVICES"
        )
}

/// What `--export` passes: ALL of `vars` (those with variable names and UTF-8 values;
/// never GPUCTL_TOKEN nor another job's identity: `job_identity`), NONE, or the listed
/// NAME / NAME=VALUE entries.
pub fn exported_env(
    spec: &str,
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<Vec<(String, String)>, String> {
    let valid = |k: &str| {
        k.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let vars: Vec<(String, String)> = vars
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| valid(k) && k != "GPUCTL_TOKEN")
        .collect();
    match spec {
        "ALL" => Ok(vars.into_iter().filter(|(k, _)| !job_identity(k)).collect()),
        "NONE" | "" => Ok(Vec::new()),
        list => list
            .split(',')
            .map(|item| match item.split_once('=') {
                Some((k, v)) if valid(k) => Ok((k.to_string(), v.to_string())),
                None if valid(item) => Ok((
                    item.to_string(),
                    vars.iter()
                        .find(|(k, _)| k == item)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default(),
                )),
                _ => Err(format!(
                    "--export: {item:?} is not NAME or NAME=VALUE (or ALL, NONE)"
                )),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        args: SubmitArgs,
    }

    fn args(a: &[&str]) -> SubmitArgs {
        Cmd::try_parse_from(std::iter::once("submit").chain(a.iter().copied()))
            .unwrap()
            .args
    }

    fn vars() -> impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)> {
        [
            ("PATH", "/home/u/bin:/usr/bin"),
            ("CONDA_PREFIX", "/opt/conda"),
            ("GPUCTL_TOKEN", "secret"),
            ("SLURM_JOB_ID", "7"),
            ("MASTER_ADDR", "10.0.0.9"),
            ("BASH_FUNC_x%%", "() { :; }"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
    }

    #[test]
    fn export_all_none_and_lists() {
        let all = exported_env("ALL", vars()).unwrap();
        let names: Vec<&str> = all.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PATH", "CONDA_PREFIX"]);
        assert!(exported_env("NONE", vars()).unwrap().is_empty());
        assert_eq!(
            exported_env("CONDA_PREFIX,SEED=7", vars()).unwrap(),
            vec![
                ("CONDA_PREFIX".to_string(), "/opt/conda".to_string()),
                ("SEED".to_string(), "7".to_string())
            ]
        );
        assert!(
            exported_env("A B", vars())
                .unwrap_err()
                .contains("not NAME")
        );
    }

    #[test]
    fn wrap_and_overrides() {
        let a = args(&[
            "--wrap",
            "python x.py",
            "-J",
            "quick",
            "-t",
            "1:30:00",
            "--gpus",
            "a100:2",
            "-c",
            "3",
            "--mem",
            "4G",
            "-N",
            "2",
            "-o",
            "q-%j.out",
        ]);
        let s = a.specs(Path::new("/w")).unwrap().remove(0).spec;
        assert_eq!(s.name, "quick");
        assert_eq!(s.script, "#!/bin/sh\npython x.py\n");
        assert_eq!(s.stdout, "q-%j.out");
        assert_eq!(s.workdir, "/w");
        let r = s.resources.unwrap();
        assert_eq!(r.time_limit_secs, 5400);
        // -G is the job's total (as sbatch's): 2 GPUs over 2 nodes is one on each.
        assert_eq!(r.gpu, Some(pb::resources::Gpu::Gpus(1)));
        assert_eq!(r.gpu_models, vec!["a100".to_string()]);
        assert_eq!((r.cpus, r.memory_bytes, r.nodes), (3, 4 << 30, 2));
        assert_eq!(time_limit("2h 30m").unwrap().as_secs(), 9000);
        assert!(time_limit("soon").is_err());
        assert!(Cmd::try_parse_from(["submit"]).is_err(), "a file or --wrap");
        assert!(Cmd::try_parse_from(["submit", "f.toml", "--wrap", "x"]).is_err());
    }

    #[test]
    fn overrides_that_make_a_bad_request_are_refused_as_the_controller_would() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("share.toml");
        std::fs::write(&file, "command = [\"python\"]\n[resources]\ngpus = 0.5\n").unwrap();
        let a = args(&[file.to_str().unwrap(), "-N", "2"]);
        let e = a.specs(Path::new("/w")).unwrap_err();
        assert!(e.contains("multi-node jobs take whole GPUs"), "{e}");
        assert!(e.starts_with(file.to_str().unwrap()), "{e}");
        let whole = dir.path().join("whole.toml");
        std::fs::write(&whole, "command = [\"python\"]\n").unwrap();
        let e = args(&[whole.to_str().unwrap(), "-N", "2", "-G", "3"])
            .specs(Path::new("/w"))
            .unwrap_err();
        assert!(e.contains("-G 3 over 2 nodes"), "{e}");
        let a = args(&[whole.to_str().unwrap(), "-w", "gpu[1-2]", "-x", "gpu2"]);
        let r = a
            .specs(Path::new("/w"))
            .unwrap()
            .remove(0)
            .spec
            .resources
            .unwrap();
        assert_eq!(
            (r.nodelist, r.exclude),
            (vec!["gpu[1-2]".to_string()], vec!["gpu2".to_string()])
        );
        let e = args(&[whole.to_str().unwrap(), "-w", "gpu[2-1]"])
            .specs(Path::new("/w"))
            .unwrap_err();
        assert!(
            e.contains("--nodelist") && e.contains("runs backwards"),
            "{e}"
        );
    }
}
