//! CUDA MPS for fractional GPU shares: the agent starts an MPS control daemon for a GPU
//! when the first share job starts on it and stops it when the last one ends, with a
//! pipe and log directory per GPU under the agent's state dir. Where
//! `nvidia-cuda-mps-control` is missing, share jobs still run (their memory is checked
//! by the agent's monitor) and get a warning saying so.
//!
//! MPS runs one server per user at a time on a GPU: shares of the same GPU held by
//! different users are time-sliced by MPS, not run side by side.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

pub const CONTROL: &str = "nvidia-cuda-mps-control";

pub struct Mps {
    exe: Option<PathBuf>,
    base: PathBuf,
    /// Share jobs per GPU UUID.
    refs: Mutex<HashMap<String, usize>>,
}

/// `name` on $PATH.
fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

impl Mps {
    /// `explicit`, or `nvidia-cuda-mps-control` on $PATH, or none.
    pub fn find(explicit: Option<PathBuf>, base: &Path) -> Mps {
        Mps {
            exe: explicit.or_else(|| which(CONTROL)),
            base: base.to_path_buf(),
            refs: Mutex::new(HashMap::new()),
        }
    }

    pub fn available(&self) -> bool {
        self.exe.is_some()
    }

    fn env(&self, gpu: &str) -> Vec<(String, String)> {
        let d = self.base.join(gpu);
        vec![
            (
                "CUDA_MPS_PIPE_DIRECTORY".into(),
                d.join("pipe").display().to_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".into(),
                d.join("log").display().to_string(),
            ),
        ]
    }

    fn control(&self, gpu: &str, args: &[&str], stdin: Option<&str>) -> Result<(), String> {
        let exe = self.exe.as_ref().ok_or("no MPS control program")?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .env("CUDA_VISIBLE_DEVICES", gpu)
            .envs(self.env(gpu))
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            let _ = pipe.write_all(text.as_bytes());
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} {} failed ({}): {}",
                exe.display(),
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// A share job starts on `gpu`: the daemon is started if it is the first. Returns
    /// the variables the job needs, or why MPS is not used (the job's warning).
    pub fn acquire(&self, gpu: &str) -> Result<Vec<(String, String)>, String> {
        if !self.available() {
            return Err(format!(
                "no {CONTROL} on this node: the GPU share is not isolated by MPS (compute share advisory; memory is watched by the agent)"
            ));
        }
        let mut refs = self.refs.lock().unwrap_or_else(|p| p.into_inner());
        let n = refs.entry(gpu.to_string()).or_default();
        if *n == 0 {
            for sub in ["pipe", "log"] {
                let d = self.base.join(gpu).join(sub);
                std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755));
            }
            self.control(gpu, &["-d"], None)?;
            tracing::info!(gpu, "MPS control daemon started");
        }
        *n += 1;
        Ok(self.env(gpu))
    }

    /// A share job found running after an agent restart: its daemon is running.
    pub fn hold(&self, gpu: &str) {
        if self.available() {
            *self
                .refs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(gpu.to_string())
                .or_default() += 1;
        }
    }

    /// A share job on `gpu` ended: the daemon stops with the last one.
    pub fn release(&self, gpu: &str) {
        let mut refs = self.refs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(n) = refs.get_mut(gpu) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            refs.remove(gpu);
            match self.control(gpu, &[], Some("quit\n")) {
                Ok(()) => tracing::info!(gpu, "MPS control daemon stopped"),
                Err(e) => tracing::warn!(gpu, "cannot stop the MPS control daemon: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_starts_with_the_first_share_and_stops_with_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("calls");
        let exe = dir.path().join("fake-mps");
        std::fs::write(
            &exe,
            format!(
                "#!/bin/sh\nin=$(cat)\necho \"$* [$CUDA_VISIBLE_DEVICES] $in\" >> {}\n",
                log.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let m = Mps::find(Some(exe), &dir.path().join("mps"));
        let env = m.acquire("GPU-a").unwrap();
        assert!(env[0].1.ends_with("mps/GPU-a/pipe"));
        m.acquire("GPU-a").unwrap();
        m.release("GPU-a");
        m.release("GPU-a");
        let calls = std::fs::read_to_string(&log).unwrap();
        assert_eq!(calls, "-d [GPU-a] \n [GPU-a] quit\n");
    }

    #[test]
    fn without_the_control_program_jobs_get_a_warning() {
        let m = Mps {
            exe: None,
            base: PathBuf::from("/nonexistent"),
            refs: Mutex::new(HashMap::new()),
        };
        let w = m.acquire("GPU-a").unwrap_err();
        assert!(w.contains("no nvidia-cuda-mps-control"), "{w}");
        m.release("GPU-a");
    }
}
