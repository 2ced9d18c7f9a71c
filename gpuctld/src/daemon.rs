//! Runs the controller: open the store, bind the listener, serve gRPC and the scheduling
//! loop until a shutdown signal, then flush.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use gpuctl_proto::auth::ClusterKey;
use gpuctl_proto::guard;
use gpuctl_proto::{agent_link_server::AgentLinkServer, controller_server::ControllerServer};

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
    /// The file `config` was read from (read again by `gpuctl admin reconfigure` and
    /// SIGHUP); `None`: the embedded defaults.
    pub config_path: Option<std::path::PathBuf>,
    /// Also serve on this Unix socket (users identified by peer credentials).
    pub socket: Option<PathBuf>,
    /// Serve Prometheus metrics here.
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the read-only web page here.
    pub web_listen: Option<SocketAddr>,
    pub tls: TlsOptions,
    /// Replicated controllers (`--id`, `--peers`); `None`: one controller.
    pub raft: Option<RaftOptions>,
}

/// This controller's place among replicated controllers.
#[derive(Debug, Clone)]
pub struct RaftOptions {
    pub id: u64,
    /// Every member's id and the address its gRPC listener is reached at.
    pub peers: std::collections::BTreeMap<u64, String>,
    /// Leader heartbeats, and the election timeout's range (a follower that hears no
    /// leader for a random time in it stands for election).
    pub heartbeat: std::time::Duration,
    pub election: (std::time::Duration, std::time::Duration),
    /// A snapshot every this many entries; the log before it is purged (up to a
    /// margin), and a member that needs what was purged gets the snapshot.
    pub snapshot_entries: u64,
}

impl RaftOptions {
    /// Parses `--peers 1=host:port,2=host:port,...`.
    pub fn parse_peers(text: &str) -> Result<std::collections::BTreeMap<u64, String>, String> {
        let mut peers = std::collections::BTreeMap::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (id, addr) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: a member is ID=HOST:PORT"))?;
            let id: u64 = id
                .trim()
                .parse()
                .map_err(|_| format!("{part:?}: a member's id is a number"))?;
            if id == 0 {
                return Err(format!("{part:?}: member ids start at 1"));
            }
            let addr = addr.trim();
            if addr.is_empty() || addr.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "{part:?}: a member's address is HOST:PORT or a URL"
                ));
            }
            if peers.insert(id, addr.to_string()).is_some() {
                return Err(format!("member {id} is named twice"));
            }
        }
        if peers.is_empty() {
            return Err("--peers names no member".into());
        }
        Ok(peers)
    }
}

/// TLS and node identity.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// Plain TCP, agents with the shared cluster key (the old mode).
    pub insecure_shared_key: bool,
    /// API tokens accepted over that plain TCP.
    pub clear_tokens: bool,
    pub node_lifetime: std::time::Duration,
    /// More names for the server certificate.
    pub names: Vec<String>,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            insecure_shared_key: false,
            clear_tokens: false,
            node_lifetime: std::time::Duration::from_secs(30 * 86_400),
            names: Vec::new(),
        }
    }
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
    if let Some(dir) = path.parent()
        && !dir.is_dir()
    {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        // Users reach the socket through it (the process's umask is 077).
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("cannot open {} to users", dir.display()))?;
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
    // Everything gpuctld writes is its own (the store holds jobs' env and scripts, the
    // cluster key): 0600 files whatever the umask it was started with. The Unix socket
    // is opened to users explicitly.
    // SAFETY: umask(2) only swaps the process's mask.
    unsafe { nix::libc::umask(0o077) };
    let (state_dir, wide) = gpuctl_proto::statedir::prepare(&opts.state_dir, 0o700)
        .with_context(|| format!("cannot create state dir {}", opts.state_dir.display()))?;
    if let Some(w) = wide {
        tracing::warn!("{w}");
    }
    let opts = Options { state_dir, ..opts };
    if let Some(r) = &opts.raft {
        members_share_secrets(&opts.state_dir, r, !opts.tls.insecure_shared_key)?;
    }
    let store = Store::open(&opts.state_dir)?;
    let key_path = opts.state_dir.join("cluster.key");
    let (key, created) = ClusterKey::load_or_create(&key_path)?;
    if created {
        if opts.tls.insecure_shared_key {
            tracing::info!(
                "created the cluster key {}: copy it to every node and start gpud with --key-file",
                key_path.display()
            );
        } else {
            tracing::info!(
                "created the cluster key {} (it stays on the controllers: nodes join with `gpuctl admin join-token create` and `gpud --join-file`)",
                key_path.display()
            );
        }
    }
    let max_message = opts.config.limits.max_message_bytes.as_u64() as usize;
    let conn_limits = connection_limits(&opts.config.limits);
    let min_free = opts.config.limits.min_free_disk.as_u64();
    let auth_timeout = opts.config.limits.unauthenticated_timeout;
    let (pki, tls) = pki_setup(&opts, key)?;
    let secure = pki.secure;
    let raft_config = opts.config.clone();
    let ctl = Controller::open(store.clone(), opts.config, opts.config_path.clone(), pki)?;
    let peer_service = match &opts.raft {
        Some(r) => Some(start_raft(&ctl, &store, r, raft_config, &key_path, secure).await?),
        None => None,
    };
    let guarded = |name: &'static str| {
        let stats = guard::Stats::new(name, conn_limits);
        ctl.watch_listener(stats.clone());
        stats
    };

    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("cannot listen on {}", opts.listen))?;
    let addr = listener.local_addr()?;
    let socket = opts.socket.as_deref().map(bind_socket).transpose()?;
    // Scripts and tests read this line to learn the port (with --listen 127.0.0.1:0).
    println!("gpuctld listening on {addr}");
    tracing::info!(%addr, tls = secure, socket = ?opts.socket, state_dir = %opts.state_dir.display(), "gpuctld started");

    tokio::spawn(restart_when_disk_recovers(store.clone(), min_free));
    if let Some(addr) = opts.metrics_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on --metrics-listen {addr}"))?;
        tracing::info!("Prometheus metrics on http://{}/metrics", l.local_addr()?);
        let l = guard::Listener::new(l, guarded("metrics"), guard::Protocol::Http1);
        let ctl = ctl.clone();
        tokio::spawn(gpuctl_proto::process::serve_metrics(l, move || {
            ctl.metrics_text()
        }));
    }
    if let Some(addr) = opts.web_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on --web-listen {addr}"))?;
        tracing::info!("web page on http://{}/", l.local_addr()?);
        let l = guard::Listener::new(l, guarded("web"), guard::Protocol::Http1);
        tokio::spawn(crate::web::serve(l, ctl.clone()));
    }
    tokio::spawn(reconfigure_on_sighup(ctl.clone()));
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
    // The Raft peer service only on TCP: local users' socket has no business with it.
    let router = |peers: bool| {
        let peer_service = if peers { peer_service.clone() } else { None };
        tonic::transport::Server::builder()
            // Large replies (ListJobs of a big queue) in fewer, bigger HTTP/2 frames.
            .max_frame_size(1 << 20)
            // Live clients answer pings, so a quiet but live connection (an agent's
            // stream between commands) is never idle to the listener's guard, and one
            // whose peer is gone is closed.
            .http2_keepalive_interval(Some(KEEPALIVE))
            .http2_keepalive_timeout(Some(KEEPALIVE))
            // Streams one connection may open at once (an idle flood's other lever).
            .max_concurrent_streams(Some(1024))
            .add_service(
                ControllerServer::new(UserApi(ctl.clone())).max_decoding_message_size(max_message),
            )
            .add_service(
                AgentLinkServer::new(AgentApi(ctl.clone())).max_decoding_message_size(max_message),
            )
            .add_optional_service(peer_service)
    };
    // The guard sets TCP_NODELAY: without it a small reply or command (a StartJob, a
    // heartbeat's answer) written after another can sit in Nagle's buffer until the
    // peer's delayed ACK, up to 40 ms on Linux.
    let grpc_limits = guard::Limits {
        auth_timeout: Some(auth_timeout.max(conn_limits.handshake_timeout)),
        ..conn_limits
    };
    let grpc_stats = guard::Stats::new("grpc", grpc_limits);
    ctl.watch_listener(grpc_stats.clone());
    let incoming = guard::Listener::new(listener, grpc_stats, guard::Protocol::Http2);
    let incoming = match tls {
        Some(config) => incoming.with_tls(config),
        None => incoming,
    };
    let tcp = router(true).serve_with_incoming_shutdown(incoming, stopped(serve_stop_rx.clone()));
    match socket {
        Some(l) => {
            // Local users have their own listener, capped per uid as TCP is per
            // address (one user's flood leaves the others served); a TCP flood cannot
            // reach it, and the descriptor reserve keeps it served.
            let unix_limits = guard::Limits {
                reserved_fds: conn_limits.reserved_fds / 4,
                authenticated_reserve: 0,
                ..conn_limits
            };
            let stats = guard::Stats::new("unix", unix_limits);
            ctl.watch_listener(stats.clone());
            let l = guard::Listener::new(l, stats, guard::Protocol::Http2);
            let unix = router(false).serve_with_incoming_shutdown(l, stopped(serve_stop_rx));
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

/// The members of a replicated cluster share its secrets: the cluster key (Raft's
/// messages are MACed with it, node keys derive from it) and, with TLS, the cluster CA
/// (members verify each other under it, and nodes verify any member). The member of
/// the lowest id makes them on its first start; another refuses to start without a
/// copy (docs/operations.md), rather than make secrets of its own that no peer trusts.
fn members_share_secrets(
    dir: &std::path::Path,
    r: &RaftOptions,
    secure: bool,
) -> anyhow::Result<()> {
    let lowest = r.peers.keys().next() == Some(&r.id);
    let needed: &[&str] = if secure {
        &["cluster.key", "ca.pem", "ca.key"]
    } else {
        &["cluster.key"]
    };
    let missing: Vec<&str> = (needed.iter().copied())
        .filter(|f| !dir.join(f).exists())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let first = r.peers.keys().next().copied().unwrap_or(r.id);
    anyhow::ensure!(
        lowest,
        "controller {} has no {} in {}: the members of a replicated cluster share them; copy them (mode 0600) from member {first}'s state dir before this member's first start (docs/operations.md)",
        r.id,
        missing.join(", "),
        dir.display()
    );
    tracing::info!(
        "this member makes the cluster's {} in {}: copy them (mode 0600) into every other member's state dir before its first start",
        needed.join(", "),
        dir.display()
    );
    Ok(())
}

/// Starts this controller's Raft (`--id`, `--peers`): the log in the store's sled
/// database, committed entries applied to the controller's state, and the peers'
/// service to serve. A pristine member waits to hear from a leader; if none is heard
/// (a new cluster), the member of the lowest id initializes the membership.
async fn start_raft(
    ctl: &std::sync::Arc<Controller>,
    store: &Store,
    r: &RaftOptions,
    config: Config,
    key_path: &std::path::Path,
    secure: bool,
) -> anyhow::Result<crate::raft::PeerServer> {
    anyhow::ensure!(
        r.peers.contains_key(&r.id),
        "--id {} is not among --peers {:?}",
        r.id,
        r.peers.keys().collect::<Vec<_>>()
    );
    // A single controller's records in this state dir: adopted by a new cluster (the
    // member of the lowest id, on its first start with --peers), else left alone.
    let adopt = (!ctl.jobs_loaded_empty()).then(|| ctl.state_to_adopt());
    let key = ClusterKey::load(key_path)?;
    let raft_config = openraft::Config {
        cluster_name: "gpuctl".into(),
        heartbeat_interval: r.heartbeat.as_millis() as u64,
        election_timeout_min: r.election.0.as_millis() as u64,
        election_timeout_max: r.election.1.as_millis() as u64,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(r.snapshot_entries),
        max_in_snapshot_log_to_keep: (r.snapshot_entries / 2).min(1_000),
        ..Default::default()
    }
    .validate()?;
    let target: std::sync::Arc<dyn crate::raft::Target> =
        std::sync::Arc::new(crate::controller::Shell(std::sync::Arc::downgrade(ctl)));
    // With TLS (the default) members reach each other under the cluster CA, which they
    // share (docs/operations.md); their messages are MACed besides.
    let tls = (secure.then(|| gpuctl_proto::tls::ClientTls::new(&ctl.pki().ca().pem(), None)))
        .transpose()?;
    let net = crate::raft::GrpcNet::new(key.clone(), tls);
    let (raft, machine) = crate::raft::open(
        r.id,
        store.db(),
        config,
        std::sync::Arc::new(raft_config),
        net.clone(),
        Some(target),
    )
    .await?;
    let service = crate::raft::PeerService::new(raft.clone(), key, r.election.1);
    tokio::spawn(net.keep_warm(
        r.id,
        raft.clone(),
        r.heartbeat.max(std::time::Duration::from_secs(1)),
    ));
    ctl.set_replicated(crate::controller::Repl {
        me: r.id,
        raft: raft.clone(),
        machine,
        confirmed_ms: std::sync::atomic::AtomicI64::new(0),
        // A cut-off leader stops answering as one before the others can elect another:
        // a member that confirmed it (after it asked) refuses every vote for the
        // longest election timeout since (openraft's leader lease on voters), and no
        // new leader is elected without one of them. A tenth is kept for clocks that
        // run at different rates. Reads at the leader are current while the lease
        // holds; a write needs a quorum whatever this says.
        lease_ms: (r.election.1.as_millis() * 9 / 10) as i64,
        proposals: Default::default(),
        importing: std::sync::atomic::AtomicBool::new(false),
    });
    let lowest = r.peers.keys().next() == Some(&r.id);
    let initialized = raft.is_initialized().await?;
    let adopt = match adopt {
        Some(_) if initialized => {
            tracing::warn!(
                "this state dir also holds a single controller's records: the replicated state comes from the log (adopted into it when the cluster was formed, or left over)"
            );
            None
        }
        Some(_) if !lowest => anyhow::bail!(
            "this state dir holds a single controller's jobs, nodes or tokens: only the member of the lowest id adopts them into a new cluster (start it with this state dir, the others empty; docs/operations.md)"
        ),
        adopt => adopt,
    };
    if adopt.is_some() {
        ctl.set_importing();
    }
    tokio::spawn(ctl.clone().follow_leadership());
    let members: std::collections::BTreeMap<u64, openraft::BasicNode> = (r.peers.iter())
        .map(|(id, addr)| (*id, openraft::BasicNode::new(addr.clone())))
        .collect();
    let wait = r.election.1 * 3;
    if let Some(state) = adopt {
        // A new cluster from a single controller's state: this member forms it at once
        // and proposes the state as its first entry.
        tracing::info!("forming a replicated cluster from this single controller's state");
        raft.initialize(members).await?;
        tokio::spawn(ctl.clone().adopt(state));
        tracing::info!(id = r.id, peers = ?r.peers, "replicated controller: Raft started");
        return Ok(service);
    }
    tokio::spawn(async move {
        if raft.is_initialized().await.unwrap_or(true) {
            return;
        }
        let mut metrics = raft.metrics();
        let heard = tokio::time::timeout(wait, async {
            while metrics.borrow().current_leader.is_none() {
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        if heard.is_err() && lowest && !raft.is_initialized().await.unwrap_or(true) {
            match raft.initialize(members).await {
                Ok(()) => tracing::info!("initialized the replicated cluster's membership"),
                Err(e) => tracing::warn!("membership not initialized: {e}"),
            }
        }
    });
    tracing::info!(id = r.id, peers = ?r.peers, "replicated controller: Raft started");
    Ok(service)
}

/// The cluster CA (made on first start), and with TLS (the default) the server's own
/// certificate for its names and addresses; `--insecure-shared-key`: plain TCP.
fn pki_setup(
    opts: &Options,
    key: ClusterKey,
) -> anyhow::Result<(
    crate::controller::PkiSetup,
    Option<std::sync::Arc<gpuctl_proto::tls::ServerConfig>>,
)> {
    let now_s = crate::controller::now_ms() / 1000;
    let (ca, ca_created) = gpuctl_proto::tls::Ca::load_or_create(&opts.state_dir, now_s)?;
    let secure = !opts.tls.insecure_shared_key;
    if ca_created {
        tracing::info!(
            fingerprint = %ca.fingerprint(),
            "created the cluster CA {}: nodes join with `gpuctl admin join-token create`; TCP users pin it with GPUCTL_CA",
            opts.state_dir.join("ca.pem").display()
        );
    }
    let tls = if secure {
        let mut names = opts.tls.names.clone();
        if let Ok(h) = nix::unistd::gethostname()
            && let Ok(h) = h.into_string()
        {
            names.push(h);
        }
        if !opts.listen.ip().is_unspecified() {
            names.push(opts.listen.ip().to_string());
        }
        let id = ca.server_identity(&names, now_s)?;
        Some(gpuctl_proto::tls::server_config(id, ca.der())?)
    } else {
        tracing::warn!(
            "--insecure-shared-key: gRPC over plain TCP (job specs, env and tokens travel in clear); agents sign with the shared cluster key"
        );
        None
    };
    let pki = crate::controller::PkiSetup {
        ca,
        key,
        secure,
        clear_tokens: opts.tls.clear_tokens,
        node_lifetime_s: opts.tls.node_lifetime.as_secs() as i64,
    };
    Ok((pki, tls))
}

/// How often the gRPC server pings a connection (and how long it waits for the answer).
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(60);

/// A TCP listener under the connection limits (the metrics and web pages').
pub type TcpGuarded = guard::Listener<tokio::net::TcpListener>;

/// The listeners' limits from the `[limits]` table; the descriptor limit is raised to
/// its hard maximum first, and the caps are kept under what it allows.
fn connection_limits(l: &gpuctl_core::config::Limits) -> guard::Limits {
    let nofile = guard::raise_fd_limit().unwrap_or(1024);
    let max = l
        .max_connections
        .min(nofile.saturating_sub(l.reserved_fds) as usize);
    if max < l.max_connections {
        tracing::warn!(
            "the descriptor limit ({nofile}) allows {max} connections, not limits.max_connections {} (raise LimitNOFILE)",
            l.max_connections
        );
    }
    guard::Limits {
        max_connections: max.max(1),
        max_per_address: l.max_connections_per_address.max(1),
        handshake_timeout: l.handshake_timeout,
        idle_timeout: l.idle_timeout.max(KEEPALIVE * 2),
        reserved_fds: l.reserved_fds,
        // At most an eighth of the cap: a small cap keeps room for everyone.
        authenticated_reserve: l.authenticated_reserve.min(max / 8),
        // The HTTP listeners' peers (scrapers, browsers) never authenticate: the gRPC
        // listener sets its own.
        auth_timeout: None,
    }
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

/// Reads the configuration again on each SIGHUP (as `gpuctl admin reconfigure`).
async fn reconfigure_on_sighup(ctl: std::sync::Arc<Controller>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!(
            "cannot install a SIGHUP handler: reconfigure with gpuctl admin reconfigure"
        );
        return;
    };
    while hup.recv().await.is_some() {
        let c = ctl.clone();
        match tokio::task::spawn_blocking(move || c.reconfigure()).await {
            Ok(Ok(_)) => {}
            Ok(Err(why)) => tracing::error!("SIGHUP: the configuration was not changed: {why}"),
            Err(e) => tracing::error!("SIGHUP: reconfigure failed: {e}"),
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
