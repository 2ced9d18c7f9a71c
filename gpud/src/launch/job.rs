//! The launcher jobs and their steps start through: each job's shim forked by the
//! launch server (`forkserver`) in the job's cgroup, as its user, with its outputs
//! opened as that user; a step of a running job (`agent::remote`) the same way, in the
//! job's cgroup, with the stdio it is given.

use std::path::{Path, PathBuf};

use super::{Done, LaunchSpec, Launched, Launcher, RunAs};

/// Each job leads its own process group and, where the host allows, lives in its own
/// cgroup with its CPU, memory and pid limits. It becomes its user before exec and
/// opens its output files as that user.
pub struct JobLauncher {
    pub cgroups: crate::cgroup::Mode,
    /// Jobs' cgroups confine their GPU devices (checked at start; see `devices`).
    pub confine_devices: bool,
    /// Jobs go to `<parent>/job-<id>` in each hierarchy.
    pub parent: String,
    /// Forks each job's shim (see `forkserver`).
    pub server: crate::forkserver::Client,
}

/// The steps of a launch between fork and exec, in order; a failing child writes its
/// step's number to a pipe so that the error names what failed.
const STEPS: [&str; 8] = [
    "enter the job's cgroup",
    "open the job's status file",
    "become the job's user",
    "enter the workdir",
    "open the stdout file",
    "open the stderr file",
    "start the program",
    "reach the launch server",
];

/// Opens an output file as the (already switched) job's user, without ever blocking:
/// O_NONBLOCK so that a FIFO without a reader fails at once (ENXIO) instead of hanging,
/// O_NOFOLLOW against a symlink, and then only a regular file or /dev/null is taken.
pub(crate) fn open_output(path: &std::ffi::CString, append: bool) -> std::io::Result<i32> {
    use nix::libc;
    let mode = if append {
        libc::O_APPEND
    } else {
        libc::O_TRUNC
    };
    // SAFETY: open/fstat/fcntl/close on a NUL-terminated path and our own fd.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_WRONLY
                | libc::O_CREAT
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK
                | libc::O_NOCTTY
                | mode,
            0o644,
        );
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            // ENXIO is a FIFO or socket without a reader, or a device with none behind
            // it (/dev/tty without a terminal): say which (ENOTTY: a device).
            let mut st: libc::stat = std::mem::zeroed();
            if e.raw_os_error() == Some(libc::ENXIO)
                && libc::lstat(path.as_ptr(), &mut st) == 0
                && matches!(st.st_mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK)
            {
                return Err(std::io::Error::from_raw_os_error(libc::ENOTTY));
            }
            return Err(e);
        }
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        let kind = st.st_mode & libc::S_IFMT;
        // /dev/null is char device 1:3.
        let dev_null =
            kind == libc::S_IFCHR && libc::major(st.st_rdev) == 1 && libc::minor(st.st_rdev) == 3;
        if kind != libc::S_IFREG && !dev_null {
            libc::close(fd);
            let device = matches!(kind, libc::S_IFCHR | libc::S_IFBLK);
            return Err(std::io::Error::from_raw_os_error(if device {
                libc::ENOTTY
            } else {
                libc::EINVAL
            }));
        }
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        Ok(fd)
    }
}

/// Explains a launch that failed at `step` with `e`.
fn launch_error(spec: &LaunchSpec, step: Option<usize>, e: &std::io::Error) -> String {
    let who = spec
        .run_as
        .as_ref()
        .map_or("the agent's user".to_string(), |u| u.name.clone());
    let errno = e.raw_os_error();
    match step {
        Some(3) => format!(
            "cannot enter workdir {} as {who}: {e}",
            spec.workdir.display()
        ),
        Some(s @ (4 | 5)) => {
            let path = if s == 4 {
                &spec.stdout
            } else {
                spec.stderr.as_ref().unwrap_or(&spec.stdout)
            };
            let what = if s == 4 { "stdout" } else { "stderr" };
            match errno {
                Some(nix::libc::EINVAL | nix::libc::EISDIR) => format!(
                    "{what} {} is not a regular file (only regular files and /dev/null are written)",
                    path.display()
                ),
                Some(nix::libc::ENOTTY) => format!(
                    "{what} {} is a device (only regular files and /dev/null are written)",
                    path.display()
                ),
                Some(nix::libc::ENXIO) => format!(
                    "{what} {} is a FIFO or socket with no reader (only regular files and /dev/null are written)",
                    path.display()
                ),
                Some(nix::libc::ELOOP) => {
                    format!("{what} {} is a symbolic link (refused)", path.display())
                }
                _ => format!("cannot open {what} {} as {who}: {e}", path.display()),
            }
        }
        Some(s) if s < STEPS.len() => format!("cannot {}: {e}", STEPS[s]),
        _ => format!(
            "cannot run {} as {who} in {}: {e}",
            spec.program.display(),
            spec.workdir.display()
        ),
    }
}

impl JobLauncher {
    /// Applies the job's device rules to its cgroup, where this agent confines devices:
    /// a job whose confinement fails does not start (it could open every GPU).
    fn confine(
        &self,
        spec: &LaunchSpec,
        cgroup: Option<&crate::cgroup::JobCgroup>,
    ) -> std::io::Result<()> {
        let Some(rules) = spec.devices.as_ref().filter(|_| self.confine_devices) else {
            return Ok(());
        };
        let Some(cg) = cgroup else {
            return Err(std::io::Error::other("the job has no cgroup"));
        };
        match cg.constrain_devices(rules)? {
            crate::cgroup::Isolation::Enforced => {
                crate::devices::grant(&cg.name, rules.uuids.clone());
                Ok(())
            }
            crate::cgroup::Isolation::Unavailable => Err(std::io::Error::other(
                "no device controller in the job's cgroups",
            )),
        }
    }
}

impl Launcher for JobLauncher {
    fn confines_devices(&self) -> bool {
        self.confine_devices
    }

    fn spawn_step(
        &self,
        spec: &LaunchSpec,
        stdio: &[std::os::fd::OwnedFd],
        tty: bool,
    ) -> std::io::Result<Launched> {
        self.launch_step(spec, stdio, tty)
    }

    fn spawn(&self, spec: &LaunchSpec) -> std::io::Result<Launched> {
        let status = spec.status_file.clone().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a job launch needs a status file",
            )
        })?;
        let cgroup = match self
            .cgroups
            .create(&self.parent, &spec.cgroup_leaf(), spec.limits)
        {
            Ok(cg) if !cg.is_empty() => Some(cg),
            Ok(_) => None,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(e),
            Err(e) => {
                tracing::warn!(job = spec.job_id, "cannot create the job's cgroup: {e}");
                None
            }
        };
        if let Err(e) = self.confine(spec, cgroup.as_ref()) {
            if let Some(cg) = &cgroup {
                cg.destroy();
            }
            return Err(std::io::Error::new(
                e.kind(),
                format!("cannot confine the job to its GPUs: {e}"),
            ));
        }
        let req = request(spec, status.clone(), cgroup.as_ref());
        let failed = |step: Option<usize>, e: std::io::Error| {
            if let Some(cg) = &cgroup {
                cg.destroy();
            }
            std::io::Error::new(e.kind(), launch_error(spec, step, &e))
        };
        match self.server.launch(&req) {
            Ok((done, crate::forkserver::Answer::Started { pid, at_ms })) => Ok(Launched {
                child: None,
                done: Some(Done::Pipe(done)),
                launched_ms: Some(at_ms),
                cgroup,
                pid: Some(pid),
                status_file: Some(status),
                record: None,
            }),
            Ok((_, crate::forkserver::Answer::Failed { step, errno })) => {
                Err(failed(Some(step), std::io::Error::from_raw_os_error(errno)))
            }
            Err(e) => Err(failed(Some(crate::forkserver::STEP_SERVER), e)),
        }
    }
}

/// What the launch server is asked for `spec`: its program, environment, workdir and
/// outputs, in `cgroup`, as its user.
fn request(
    spec: &LaunchSpec,
    status: PathBuf,
    cgroup: Option<&crate::cgroup::JobCgroup>,
) -> crate::forkserver::Request {
    crate::forkserver::Request {
        program: spec.program.clone(),
        args: spec.args.clone(),
        env: spec
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        workdir: spec.workdir.clone(),
        stdout: spec.stdout.clone(),
        stderr: spec.stderr.clone(),
        append: spec.append,
        status,
        cgroup_procs: cgroup
            .map(|c| c.dirs.iter().map(|d| d.join("cgroup.procs")).collect())
            .unwrap_or_default(),
        cgroup_v2: cgroup.and_then(|c| c.v2_dir().map(Path::to_path_buf)),
        user: spec.run_as.as_ref().map(become_user),
        passed_stdio: false,
        tty: false,
        banner: spec.banner.clone(),
    }
}

fn become_user(u: &RunAs) -> crate::forkserver::Become {
    crate::forkserver::Become {
        uid: u.uid,
        gid: u.gid,
        groups: u.groups.clone(),
    }
}

impl JobLauncher {
    /// A step of a running job, started from outside it (`agent::remote`): in the
    /// job's cgroup (which it does not own: the job's end removes it), as its user, in
    /// its workdir, with `stdio` (a terminal's slave three times when `tty`).
    fn launch_step(
        &self,
        spec: &LaunchSpec,
        stdio: &[std::os::fd::OwnedFd],
        tty: bool,
    ) -> std::io::Result<Launched> {
        let status = spec.status_file.clone().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a step's launch needs a status file",
            )
        })?;
        let cgroup = self.cgroups.existing(&self.parent, &spec.cgroup_leaf());
        // Where jobs have cgroups, a step never runs outside its job's: one that is gone
        // is a job that is ending.
        if cgroup.is_none() && !matches!(self.cgroups, crate::cgroup::Mode::None) {
            return Err(std::io::Error::other(format!(
                "job {}'s cgroup is gone: the job is ending",
                spec.job_id
            )));
        }
        // The job's request, but for its outputs: the stdio passed with it.
        let req = crate::forkserver::Request {
            stdout: PathBuf::from("/dev/null"),
            stderr: None,
            append: false,
            passed_stdio: true,
            tty,
            banner: None,
            ..request(spec, status.clone(), cgroup.as_ref())
        };
        match self.server.launch_with(&req, stdio) {
            Ok((done, crate::forkserver::Answer::Started { pid, at_ms })) => Ok(Launched {
                child: None,
                done: Some(Done::Pipe(done)),
                launched_ms: Some(at_ms),
                cgroup: None,
                pid: Some(pid),
                status_file: Some(status),
                record: None,
            }),
            Ok((_, crate::forkserver::Answer::Failed { step, errno })) => {
                Err(std::io::Error::other(launch_error(
                    spec,
                    Some(step),
                    &std::io::Error::from_raw_os_error(errno),
                )))
            }
            Err(e) => Err(e),
        }
    }
}
