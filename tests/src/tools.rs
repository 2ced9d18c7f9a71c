//! What the tests of tools that drive Slurm and of metrics share: Slurm's names on a
//! PATH, a venv's python, a `/metrics` scrape.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Cluster, bin, skipped};

impl Cluster {
    /// `gpuctl slurm-links` into this cluster's directory: a directory holding gpuctl
    /// under Slurm's names (sbatch, squeue, ...).
    pub fn slurm_links(&self) -> PathBuf {
        let links = self.path("slurm-bin");
        let made = Command::new(bin("gpuctl"))
            .args(["slurm-links", links.to_str().unwrap()])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&made.stdout);
        assert!(made.status.success() && said.contains("sbatch"), "{said}");
        links
    }

    /// `program` as a tool that drives Slurm runs it: `links` (`slurm_links`), then
    /// `extra`, first on its PATH, talking to this controller.
    pub fn slurm_tool(
        &self,
        program: impl AsRef<std::ffi::OsStr>,
        links: &Path,
        extra: &[&Path],
    ) -> Command {
        let mut path: Vec<String> = std::iter::once(links)
            .chain(extra.iter().copied())
            .map(|p| p.display().to_string())
            .collect();
        path.push(std::env::var("PATH").unwrap_or_default());
        let mut cmd = Command::new(program);
        cmd.env("PATH", path.join(":"))
            .env("GPUCTL_CONTROLLER", self.url());
        cmd
    }
}

/// The python of a venv a test needs (`.ci/run` makes it): `env` names it where set,
/// else `default`; it must `import` the test's packages. `None` (said as skipped, or a
/// failure where `require` is set) when it cannot.
pub fn venv_python(env: &str, default: &str, import: &str, require: &str) -> Option<String> {
    let p = std::env::var(env).unwrap_or_else(|_| default.into());
    let ok = Command::new(&p)
        .args(["-c", &format!("import {import}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(p);
    }
    skipped(
        require,
        &format!("a python with {import} at {p} (.ci/run installs one; or set {env})"),
    );
    None
}

/// The text a `/metrics` endpoint on loopback `port` answers (status line and headers
/// included).
pub fn scrape(port: u16) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}
