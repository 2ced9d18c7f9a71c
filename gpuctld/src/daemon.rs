//! Runs the controller: open the store, bind the listener, serve gRPC and the scheduling
//! loop until a shutdown signal, then flush.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use gpuctl_proto::{agent_link_server::AgentLinkServer, controller_server::ControllerServer};
use tokio_stream::wrappers::TcpListenerStream;

use crate::config::Config;
use crate::controller::Controller;
use crate::server::{AgentApi, MAX_MESSAGE_BYTES, UserApi};
use crate::store::Store;

pub struct Options {
    pub listen: SocketAddr,
    pub state_dir: PathBuf,
    pub config: Config,
}

/// Serves until `shutdown` resolves.
pub async fn run(
    opts: Options,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&opts.state_dir)
        .with_context(|| format!("cannot create state dir {}", opts.state_dir.display()))?;
    let store = Store::open(&opts.state_dir)?;
    let ctl = Controller::open(store.clone(), opts.config)?;

    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("cannot listen on {}", opts.listen))?;
    let addr = listener.local_addr()?;
    // Scripts and tests read this line to learn the port (with --listen 127.0.0.1:0).
    println!("gpuctld listening on {addr}");
    tracing::info!(%addr, state_dir = %opts.state_dir.display(), "gpuctld started");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sched = tokio::spawn(ctl.clone().scheduler_loop(stop_rx.clone()));
    let watchdog = tokio::spawn(ctl.clone().watchdog_loop(stop_rx));

    let ctl_for_stop = ctl.clone();
    let shutdown = async move {
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight requests");
        // Agent streams never end by themselves; closing them lets the server stop.
        ctl_for_stop.close_agent_streams();
    };
    tonic::transport::Server::builder()
        .add_service(
            ControllerServer::new(UserApi(ctl.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            AgentLinkServer::new(AgentApi(ctl.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
        .context("gRPC server failed")?;
    let _ = stop_tx.send(true);
    let _ = sched.await;
    let _ = watchdog.await;
    store.flush().await?;
    tracing::info!("state flushed; bye");
    Ok(())
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
