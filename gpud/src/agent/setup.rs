//! What the agent sets up on its host at start: the job cgroups it can use (limits,
//! migration cost, GPU device confinement), its identity, its metrics listener.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use super::Options;
use crate::exporter::Exporter;

/// The cgroup hierarchy jobs go into (after checking a process can really be moved
/// there), and whether jobs' cgroups can confine their GPU devices.
pub(super) fn job_cgroups(opts: &Options, cgroup_parent: &str) -> (crate::cgroup::Mode, bool) {
    let mut cgroups = crate::cgroup::Mode::detect(&opts.cgroup_base);
    if let Err(e) = cgroups.verify(cgroup_parent) {
        tracing::warn!(
            "{} is there but a process cannot be moved into it ({e}); not using cgroups",
            cgroups.describe()
        );
        cgroups = crate::cgroup::Mode::None;
    }
    match cgroups {
        crate::cgroup::Mode::None => tracing::warn!(
            "no writable cgroup hierarchy under {}: jobs run in process groups only, without CPU/memory limits",
            opts.cgroup_base.display()
        ),
        crate::cgroup::Mode::V2 { controllers, .. } if !controllers.missing().is_empty() => {
            tracing::warn!("job limits through {}", cgroups.describe())
        }
        ref m => tracing::info!("job limits through {}", m.describe()),
    }
    migration_cost(&cgroups, opts.cgroup_favordynmods);
    let confine_devices = match cgroups.verify_devices(cgroup_parent) {
        Ok(crate::cgroup::Isolation::Enforced) => {
            tracing::info!("jobs are confined to their GPUs' device nodes");
            true
        }
        Ok(crate::cgroup::Isolation::Unavailable) => {
            tracing::warn!(
                "GPU device isolation is unavailable ({}): a job can open GPUs it was not given",
                cgroups.describe()
            );
            false
        }
        Err(e) => {
            tracing::warn!(
                "GPU device isolation failed its check ({e}): a job can open GPUs it was not given"
            );
            false
        }
    };
    (cgroups, confine_devices)
}

/// Serves the Prometheus endpoint at `addr` behind a bounded listener.
pub(super) async fn serve_metrics(
    addr: std::net::SocketAddr,
    exporter: Arc<Exporter>,
) -> anyhow::Result<()> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on --metrics-listen {addr}"))?;
    tracing::info!("Prometheus metrics on http://{}/metrics", l.local_addr()?);
    // Scrapers are few: a flood of idle connections is refused, not served.
    use gpuctl_proto::guard;
    let nofile = guard::raise_fd_limit().unwrap_or(1024);
    let limits = guard::Limits {
        max_connections: 256.min(nofile.saturating_sub(256) as usize).max(1),
        max_per_address: 32,
        handshake_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
        reserved_fds: 128,
        authenticated_reserve: 0,
        auth_timeout: None,
    };
    let stats = guard::Stats::new("metrics", limits);
    exporter.conns.watch(stats.clone());
    let l = guard::Listener::new(l, stats, guard::Protocol::Http1);
    tokio::spawn(crate::exporter::serve(l, exporter));
    Ok(())
}

/// Says (and with `--cgroup-favordynmods`, fixes) what each job launch pays to move its
/// first process into its cgroup.
fn migration_cost(cgroups: &crate::cgroup::Mode, favor: bool) {
    use crate::cgroup::Migration;
    let now = if favor {
        cgroups.favor_dynmods().unwrap_or_else(|e| {
            tracing::warn!("cannot remount the cgroup2 mount with favordynmods: {e}");
            Migration::Unknown
        })
    } else {
        let release = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        std::fs::read_to_string("/proc/mounts")
            .map_or(Migration::Unknown, |m| cgroups.migration(&m, &release))
    };
    match now {
        Migration::Fast => tracing::info!("cgroup migrations are cheap (favordynmods)"),
        Migration::Created => {
            tracing::info!("jobs are created in their cgroup (clone3): nothing is migrated")
        }
        Migration::Slow(path) => tracing::warn!(
            "a job launched after a quiet spell can wait 10-50 ms for the kernel to move it into its v1 cgroups: {} is mounted without favordynmods (start gpud with --cgroup-favordynmods, or boot with cgroup_favordynmods=true)",
            path.display()
        ),
        Migration::Unknown => {}
    }
}

/// This agent's identity, `<state_dir>/agent-id` (created with the state dir when new).
pub fn identity(state_dir: &std::path::Path) -> anyhow::Result<String> {
    let (dir, _) = gpuctl_proto::statedir::prepare(state_dir, 0o711)
        .with_context(|| format!("cannot create state dir {}", state_dir.display()))?;
    agent_id(&dir)
}

/// The stable identity of this agent: created once in its state dir.
pub(super) fn agent_id(state_dir: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let path = state_dir.join("agent-id");
    if let Ok(id) = std::fs::read_to_string(&path) {
        let id = id.trim().to_string();
        if !id.is_empty() {
            return Ok(id);
        }
    }
    use rand::RngCore;
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    let id = hex::encode(b);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(id.as_bytes())?;
    f.sync_all()?;
    Ok(id)
}
