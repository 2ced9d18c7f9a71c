//! What every gpuctl daemon sets up alike: its logs (`init_logging`) and its
//! Prometheus endpoint (`serve_metrics`).

/// How a daemon writes its logs (`--log-format`, `GPUCTL_LOG_FORMAT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr, filtered by `GPUCTL_LOG` (else `default`): text with colours only on
/// a terminal (log files and journald get plain text), or JSON lines.
pub fn init_logging(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUCTL_LOG")
        .unwrap_or_else(|_| default.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}

/// Serves `GET /metrics` (OpenMetrics text, as `text` renders it at each scrape) on
/// `listener` until the process ends.
pub async fn serve_metrics<L, F>(listener: L, text: F)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    use axum::http::header::CONTENT_TYPE;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let text = text.clone();
            async move {
                (
                    [(
                        CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    text(),
                )
            }
        }),
    );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!("metrics server failed: {e}");
    }
}
