//! The read-only web page (`gpuctld --web-listen ADDR`): one HTML file with its script
//! inline (no build step, nothing fetched from elsewhere) and one JSON document it polls,
//! `GET /api/state`: the cluster's totals, every node's GPUs (the heat map), jobs, users,
//! the replicated controllers (if any), and the cluster over time (a point every
//! [`SAMPLE_EVERY`], kept for a day).
//!
//! Everything users control (job names, users, reasons) reaches the page as JSON and is
//! put into the document as text, never as markup.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_core::jobs::owner;
use gpuctl_proto as pb;
use serde::Serialize;

use crate::controller::{Controller, now_ms};
use crate::metrics::Snapshot;

/// How often the cluster's totals are recorded for the charts.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// A day of points.
const KEEP: usize = 8640;
/// Jobs on the page: every running one, the newest pending ones, the latest ended.
const MAX_PENDING: usize = 300;
const MAX_DONE: usize = 50;
const DONE_WITHIN_MS: i64 = 3_600_000;

const PAGE: &str = include_str!("web/index.html");

#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Point {
    pub t_ms: i64,
    pub gpus: u64,
    /// Allocated GPU capacity in GPUs (a quarter share counts 0.25).
    pub allocated: f64,
    /// Mean utilisation of the GPUs that reported a sample (%), if any did.
    pub util_mean: Option<f64>,
    pub pending: u64,
    pub running: u64,
}

#[derive(Debug, Serialize)]
struct Gpu {
    index: u32,
    model: String,
    util_pct: Option<u32>,
    mem_used_mib: Option<u64>,
    memory_mib: u64,
    temp_c: Option<u32>,
    power_w: Option<f64>,
    /// Allocated compute, 0 to 1.
    allocated: f64,
    jobs: Vec<u64>,
    mig: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Node {
    name: String,
    state: String,
    reason: String,
    gpu_backend: String,
    gpus: Vec<Gpu>,
}

#[derive(Debug, Serialize)]
struct Job {
    id: u64,
    name: String,
    user: String,
    state: String,
    gpus: String,
    node: String,
    reason: String,
    submit_ms: i64,
    start_ms: i64,
    end_ms: i64,
}

/// A replicated controller as this one knows it (none listed with one controller).
#[derive(Debug, Serialize)]
struct Member {
    id: u64,
    address: String,
    state: String,
    leader: bool,
    term: u64,
    /// `None` where the answering controller does not know it (a follower knows its
    /// own and not the others'): shown as "-", not as 0.
    commit_index: Option<u64>,
}

#[derive(Debug, Serialize)]
struct User {
    user: String,
    running: u64,
    pending: u64,
    /// GPUs held by the user's running jobs (shares as fractions).
    gpus: f64,
}

/// An account's opportunistic work in borrowed idle (issue 60).
#[derive(Debug, Serialize)]
struct Borrowed {
    account: String,
    /// GPUs its borrowers run on now (shares as fractions).
    gpus: f64,
    /// GPU-hours they ran in borrowed idle since the page's server started (sampled
    /// every [`SAMPLE_EVERY`]).
    gpu_hours: f64,
}

#[derive(Debug, Serialize)]
struct State<'a> {
    now_ms: i64,
    now: Point,
    nodes: Vec<Node>,
    jobs: Vec<Job>,
    users: Vec<User>,
    borrowed: Vec<Borrowed>,
    controllers: Vec<Member>,
    history: &'a [Point],
}

/// The points recorded so far, and each account's GPU-seconds in borrowed idle.
#[derive(Default)]
pub struct History {
    points: Mutex<VecDeque<Point>>,
    borrowed: Mutex<std::collections::BTreeMap<String, f64>>,
}

impl History {
    fn push(&self, p: Point) {
        let mut h = self.points.lock().unwrap_or_else(|e| e.into_inner());
        if h.len() == KEEP {
            h.pop_front();
        }
        h.push_back(p);
    }

    fn snapshot(&self) -> Vec<Point> {
        let h = self.points.lock().unwrap_or_else(|e| e.into_inner());
        h.iter().copied().collect()
    }

    /// Adds `secs` of each account's borrowed GPUs now.
    fn borrow_for(&self, now: &std::collections::BTreeMap<String, f64>, secs: f64) {
        let mut b = self.borrowed.lock().unwrap_or_else(|e| e.into_inner());
        for (account, gpus) in now {
            *b.entry(account.clone()).or_default() += gpus * secs;
        }
    }

    /// Every account that borrowed since the start or borrows now.
    fn borrowed(&self, now: &std::collections::BTreeMap<String, f64>) -> Vec<Borrowed> {
        let b = self.borrowed.lock().unwrap_or_else(|e| e.into_inner());
        let mut accounts: Vec<&String> = b.keys().chain(now.keys()).collect();
        accounts.sort();
        accounts.dedup();
        (accounts.into_iter())
            .map(|a| Borrowed {
                account: a.clone(),
                gpus: now.get(a).copied().unwrap_or(0.0),
                gpu_hours: b.get(a).copied().unwrap_or(0.0) / 3600.0,
            })
            .collect()
    }
}

/// The cluster's totals in a snapshot of the state.
fn point(snap: &Snapshot) -> Point {
    let count = |state: &str| snap.jobs_by_state.get(state).copied().unwrap_or(0);
    Point {
        t_ms: now_ms(),
        gpus: snap.gpus_total,
        allocated: snap.gpus_allocated,
        util_mean: snap.gpu_util_mean,
        pending: count("PENDING"),
        running: count("RUNNING"),
    }
}

/// What a job asked for, short: `2`, `0.25`, `1 x 3g.40gb`, `-`.
fn node_of(n: &pb::Node) -> Node {
    Node {
        name: n.name.clone(),
        state: n.state().as_str_name().to_string(),
        reason: n.reason.clone(),
        gpu_backend: n.gpu_backend.clone(),
        gpus: n
            .gpus
            .iter()
            .map(|g| Gpu {
                index: g.index,
                model: g.model.clone(),
                util_pct: g.metrics.as_ref().map(|m| m.util_pct),
                mem_used_mib: g.metrics.as_ref().map(|m| m.mem_used_mib),
                memory_mib: g.memory_mib,
                temp_c: g.metrics.as_ref().map(|m| m.temp_c),
                power_w: g.metrics.as_ref().map(|m| m.power_w),
                allocated: f64::from(g.compute_allocated_milli.min(1000)) / 1000.0,
                jobs: g.jobs.clone(),
                mig: g.mig.iter().map(|m| m.profile.clone()).collect(),
            })
            .collect(),
    }
}

/// The members of replicated controllers (none with one controller).
fn controllers(ctl: &Controller) -> Vec<Member> {
    let c = ctl.controllers();
    if !c.replicated {
        return Vec::new();
    }
    (c.members.into_iter())
        .map(|m| Member {
            id: m.id,
            address: m.address,
            state: m.state,
            leader: m.leader,
            term: m.term,
            commit_index: (m.commit_index > 0).then_some(m.commit_index),
        })
        .collect()
}

fn state_json(ctl: &Controller, history: &History) -> String {
    let list = ctl.list_nodes(&[]);
    let snap = ctl.snapshot(&list);
    let now = point(&snap);
    let nodes = list.nodes;
    let jobs = ctl.web_jobs(now.t_ms - DONE_WITHIN_MS, MAX_PENDING, MAX_DONE);
    // Every user's counts (the jobs listed are capped).
    let users = snap
        .jobs_by_user
        .iter()
        .map(|(user, &(running, pending))| User {
            user: user.clone(),
            running,
            pending,
            gpus: snap.running_gpus_by_user.get(user).copied().unwrap_or(0.0),
        })
        .collect();
    let borrowed = history.borrowed(&snap.borrowed_gpus_by_account);
    let mut history = history.snapshot();
    // The chart always reaches now.
    history.push(now);
    let state = State {
        now_ms: now.t_ms,
        now,
        nodes: nodes.iter().map(node_of).collect(),
        jobs: jobs
            .iter()
            .map(|j| Job {
                id: j.id,
                name: j.spec.name.clone(),
                user: owner(j).to_string(),
                state: gpuctl_core::record::state_name(j.state).to_string(),
                gpus: j.spec.resources.gpu_summary(),
                node: j.node.clone(),
                reason: j.reason.clone(),
                submit_ms: j.submit_time_ms,
                start_ms: j.start_time_ms,
                end_ms: j.end_time_ms,
            })
            .collect(),
        users,
        borrowed,
        controllers: controllers(ctl),
        history: &history,
    };
    serde_json::to_string(&state).expect("the state serialises")
}

/// The page may run its own inline script (named by its hash) and talk to this server,
/// nothing else: had anything a user controls slipped into the document as markup, it
/// could still not run.
fn content_security_policy(page: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    let script = page
        .split_once("<script>")
        .and_then(|(_, rest)| rest.split_once("</script>"))
        .map_or("", |(s, _)| s);
    let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(script));
    format!(
        "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; \
         connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'"
    )
}

/// Serves the page until the process ends, and records a point every [`SAMPLE_EVERY`].
pub async fn serve(
    listener: gpuctl_proto::guard::Listener<tokio::net::TcpListener>,
    ctl: Arc<Controller>,
) {
    use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
    let history = Arc::new(History::default());
    {
        let (ctl, history) = (ctl.clone(), history.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            loop {
                tick.tick().await;
                let snap = ctl.snapshot(&ctl.list_nodes(&[]));
                history.borrow_for(&snap.borrowed_gpus_by_account, SAMPLE_EVERY.as_secs_f64());
                history.push(point(&snap));
            }
        });
    }
    let csp: &'static str = Box::leak(content_security_policy(PAGE).into_boxed_str());
    let app = axum::Router::new()
        .route(
            "/",
            axum::routing::get(move || async move {
                (
                    [
                        (CONTENT_TYPE, "text/html; charset=utf-8"),
                        (CONTENT_SECURITY_POLICY, csp),
                    ],
                    PAGE,
                )
            }),
        )
        .route(
            "/api/state",
            axum::routing::get(move || {
                let (ctl, history) = (ctl.clone(), history.clone());
                async move {
                    let body = tokio::task::spawn_blocking(move || state_json(&ctl, &history))
                        .await
                        .unwrap_or_else(|_| "{}".to_string());
                    (
                        [
                            (CONTENT_TYPE, "application/json"),
                            (CACHE_CONTROL, "no-store"),
                        ],
                        body,
                    )
                }
            }),
        );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!("web page server failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_a_day() {
        let h = History::default();
        for t in 0..(KEEP as i64 + 5) {
            h.push(Point {
                t_ms: t,
                gpus: 1,
                allocated: 0.0,
                util_mean: None,
                pending: 0,
                running: 0,
            });
        }
        let s = h.snapshot();
        assert_eq!(s.len(), KEEP);
        assert_eq!(s[0].t_ms, 5);
    }

    #[test]
    fn borrowed_gpu_hours_add_up_per_account() {
        let h = History::default();
        let now = std::collections::BTreeMap::from([("research".to_string(), 0.5)]);
        for _ in 0..720 {
            h.borrow_for(&now, 10.0);
        }
        let later = std::collections::BTreeMap::from([("ml".to_string(), 2.0)]);
        let b = h.borrowed(&later);
        assert_eq!(b.len(), 2);
        assert_eq!(
            (b[0].account.as_str(), b[0].gpus, b[0].gpu_hours),
            ("ml", 2.0, 0.0)
        );
        assert_eq!((b[1].account.as_str(), b[1].gpus), ("research", 0.0));
        assert!((b[1].gpu_hours - 1.0).abs() < 1e-9, "{}", b[1].gpu_hours);
    }
}
