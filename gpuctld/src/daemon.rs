//! Runs the controller: open the store, bind the listener, serve gRPC and the scheduling
//! loop until a shutdown signal, then flush.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use gpuctl_proto::auth::ClusterKey;
use gpuctl_proto::{agent_link_server::AgentLinkServer, controller_server::ControllerServer};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};

use crate::config::Config;
use crate::controller::Controller;
use crate::server::{AgentApi, UserApi};
use crate::store::Store;

/// The longest a shutdown may take after SIGTERM.
pub const SHUTDOWN_BOUND: std::time::Duration = std::time::Duration::from_secs(30);

pub struct Options {
    pub listen: SocketAddr,
    pub state_dir: PathBuf,
    pub config: Config,
    /// Also serve on this Unix socket (users identified by peer credentials).
    pub socket: Option<PathBuf>,
    /// Serve Prometheus metrics here.
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the read-only web page here.
    pub web_listen: Option<SocketAddr>,
}

/// Binds the user socket: a stale file from an earlier run is replaced; anyone may
/// connect (the controller identifies callers by their uid).
fn bind_socket(path: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        anyhow::ensure!(
            meta.file_type().is_socket(),
            "{} exists and is not a socket; refusing to replace it",
            path.display()
        );
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!("{} is in use by a running gpuctld", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let l = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("cannot make {} world-connectable", path.display()))?;
    Ok(l)
}

/// Serves until `shutdown` resolves.
pub async fn run(
    opts: Options,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&opts.state_dir)
        .with_context(|| format!("cannot create state dir {}", opts.state_dir.display()))?;
    let store = Store::open(&opts.state_dir)?;
    let key_path = opts.state_dir.join("cluster.key");
    let (key, created) = ClusterKey::load_or_create(&key_path)?;
    if created {
        tracing::info!(
            "created the cluster key {}: copy it to every node and start gpud with --key-file",
            key_path.display()
        );
    }
    let max_message = opts.config.limits.max_message_bytes.as_u64() as usize;
    let min_free = opts.config.limits.min_free_disk.as_u64();
    let ctl = Controller::open(store.clone(), opts.config, key)?;

    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("cannot listen on {}", opts.listen))?;
    let addr = listener.local_addr()?;
    let socket = opts.socket.as_deref().map(bind_socket).transpose()?;
    // Scripts and tests read this line to learn the port (with --listen 127.0.0.1:0).
    println!("gpuctld listening on {addr}");
    tracing::info!(%addr, socket = ?opts.socket, state_dir = %opts.state_dir.display(), "gpuctld started");

    tokio::spawn(restart_when_disk_recovers(store.clone(), min_free));
    if let Some(addr) = opts.metrics_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on --metrics-listen {addr}"))?;
        tracing::info!("Prometheus metrics on http://{}/metrics", l.local_addr()?);
        tokio::spawn(crate::metrics::serve(l, ctl.clone()));
    }
    if let Some(addr) = opts.web_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on --web-listen {addr}"))?;
        tracing::info!("web page on http://{}/", l.local_addr()?);
        tokio::spawn(crate::web::serve(l, ctl.clone()));
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sched = tokio::spawn(ctl.clone().scheduler_loop(stop_rx.clone()));
    let watchdog = tokio::spawn(ctl.clone().watchdog_loop(stop_rx.clone()));

    // One shutdown for both listeners.
    let (serve_stop_tx, serve_stop_rx) = tokio::sync::watch::channel(false);
    let ctl_for_stop = ctl.clone();
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight requests");
        // Agent streams never end by themselves; closing them lets the server stop.
        ctl_for_stop.close_agent_streams();
        let _ = serve_stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    // Shutdown always ends: requests still in flight this long after the signal (a
    // write stuck on a failing disk) are abandoned; acknowledged work is already durable.
    let mut deadline_rx = serve_stop_rx.clone();
    tokio::spawn(async move {
        let _ = deadline_rx.wait_for(|v| *v).await;
        tokio::time::sleep(SHUTDOWN_BOUND).await;
        tracing::error!("shutdown did not finish within {SHUTDOWN_BOUND:?}; exiting anyway");
        std::process::exit(1);
    });
    let router = || {
        tonic::transport::Server::builder()
            // Large replies (ListJobs of a big queue) in fewer, bigger HTTP/2 frames.
            .max_frame_size(1 << 20)
            .add_service(
                ControllerServer::new(UserApi(ctl.clone())).max_decoding_message_size(max_message),
            )
            .add_service(
                AgentLinkServer::new(AgentApi(ctl.clone())).max_decoding_message_size(max_message),
            )
    };
    // Without TCP_NODELAY a small reply or command (a StartJob, a heartbeat's answer)
    // written after another can sit in Nagle's buffer until the peer's delayed ACK, up
    // to 40 ms on Linux: that was most of the time from dispatch to launch.
    let incoming = tokio_stream::StreamExt::map(TcpListenerStream::new(listener), |s| {
        if let Ok(s) = &s
            && let Err(e) = s.set_nodelay(true)
        {
            tracing::warn!("cannot set TCP_NODELAY on a connection: {e}");
        }
        s
    });
    let tcp = router().serve_with_incoming_shutdown(incoming, stopped(serve_stop_rx.clone()));
    match socket {
        Some(l) => {
            let unix = router()
                .serve_with_incoming_shutdown(UnixListenerStream::new(l), stopped(serve_stop_rx));
            let (a, b) = tokio::join!(tcp, unix);
            a.context("gRPC server (TCP) failed")?;
            b.context("gRPC server (Unix socket) failed")?;
        }
        None => tcp.await.context("gRPC server failed")?,
    }
    let _ = stop_tx.send(true);
    let _ = sched.await;
    let _ = watchdog.await;
    store.flush().await?;
    if let Some(p) = &opts.socket {
        let _ = std::fs::remove_file(p);
    }
    tracing::info!("state flushed; bye");
    Ok(())
}

/// sled does not come back from a full disk in place (after ENOSPC its flushes hang).
/// Once the store has failed, this waits until the state dir's disk has room again
/// (`min_free_disk`, at least 16 MiB) and then re-executes gpuctld with the same
/// arguments: the new process recovers from the durable state as after a crash, binds
/// the same addresses, and agents re-attach by themselves. Nothing acknowledged is lost:
/// acknowledgements wait for a flush that succeeded.
async fn restart_when_disk_recovers(store: Store, min_free: u64) {
    let need = min_free.max(16 << 20);
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        if !store.failed() {
            continue;
        }
        if store.free_bytes().is_some_and(|f| f >= need) {
            tracing::warn!(
                "state store failed earlier and the disk has room again: restarting from the durable state"
            );
            use std::os::unix::process::CommandExt;
            let exe = std::env::current_exe();
            let err = match exe {
                Ok(exe) => std::process::Command::new(exe)
                    .args(std::env::args_os().skip(1))
                    .exec(),
                Err(e) => e,
            };
            tracing::error!(
                "cannot restart gpuctld: {err}; exiting for the supervisor to restart it"
            );
            std::process::exit(1);
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
