//! The controller's Prometheus metrics (`gpuctld --metrics-listen ADDR`, `GET /metrics`):
//! jobs by state, pending jobs by reason, nodes by state, GPUs total and allocated,
//! fragmentation, running GPUs and GPU-hours per user, submits, the scheduling pass and
//! store commit times. Gauges are read from the controller's state at each scrape;
//! counters and histograms are kept as things happen.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UserLabel {
    user: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccountLabel {
    account: String,
}

type GaugeF = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The Raft figures (replicated controllers; one controller: leader, term 0).
pub struct RaftGauges {
    pub leader: Gauge,
    pub term: Gauge,
    pub applied: Gauge,
    pub commit_seconds: Histogram,
    pub lag: Family<MemberLabel, Gauge>,
}

impl RaftGauges {
    fn register(r: &mut Registry) -> RaftGauges {
        let leader = Gauge::default();
        leader.set(1);
        r.register(
            "gpuctl_raft_is_leader",
            "1 while this controller leads (decides) its cluster; one controller always does",
            leader.clone(),
        );
        let term = Gauge::default();
        r.register(
            "gpuctl_raft_term",
            "The Raft term this controller is in (0: one controller, no Raft)",
            term.clone(),
        );
        let applied = Gauge::default();
        r.register(
            "gpuctl_raft_applied_index",
            "The last log index this controller applied",
            applied.clone(),
        );
        let commit_seconds = Histogram::new(exponential_buckets(0.0002, 2.0, 16));
        r.register(
            "gpuctl_raft_commit_seconds",
            "From a change's proposal to its apply here, once a quorum holds it (the leader's)",
            commit_seconds.clone(),
        );
        let lag = Family::<MemberLabel, Gauge>::default();
        r.register(
            "gpuctl_raft_member_lag_entries",
            "On the leader: how many log entries each other member is behind (-1: not heard from)",
            lag.clone(),
        );
        RaftGauges {
            leader,
            term,
            applied,
            commit_seconds,
            lag,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabel {
    pub member: String,
}

/// What the controller's state says at one moment (computed under its lock).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Snapshot {
    pub jobs_by_state: BTreeMap<String, u64>,
    pub pending_by_reason: BTreeMap<String, u64>,
    pub nodes_by_state: BTreeMap<String, u64>,
    pub gpus_total: u64,
    /// Allocated GPU capacity in GPUs (a quarter share counts 0.25).
    pub gpus_allocated: f64,
    pub fragmentation_gpus: f64,
    /// Running GPUs per user and per account (shares as fractions).
    pub running_gpus_by_user: BTreeMap<String, f64>,
    pub running_gpus_by_account: BTreeMap<String, f64>,
    /// GPUs the opportunistic jobs of each account run on (not in the two above).
    pub borrowed_gpus_by_account: BTreeMap<String, f64>,
    /// MIG instances of up nodes, and those held by jobs.
    pub mig_instances: u64,
    pub mig_instances_allocated: u64,
    /// GPUs holding shares (fractional jobs), and the share jobs on them.
    pub shared_gpus: u64,
    pub share_slots: u64,
    /// Dynamic MIG: layout changes asked since the controller started, and under way.
    pub mig_reconfigurations: u64,
    pub mig_changing: u64,
    /// Mean utilisation of the up nodes' GPUs that reported a sample (%), if any did
    /// (the web page's; the GPU series themselves come from the agents).
    pub gpu_util_mean: Option<f64>,
    /// Running and pending jobs per user (the web page's users).
    pub jobs_by_user: BTreeMap<String, (u64, u64)>,
}

impl Snapshot {
    /// Utilisation and allocation as the simulator and `gpuctl report` define them:
    /// the mean busy fraction of the GPUs that reported (each capped at 100%), and the
    /// allocated capacity over the GPUs there are (0 without GPUs).
    pub fn cluster_ratios(&self) -> (f64, f64) {
        let busy = self.gpu_util_mean.map_or(0.0, |u| u / 100.0);
        let held = if self.gpus_total > 0 {
            (self.gpus_allocated / self.gpus_total as f64).min(1.0)
        } else {
            0.0
        };
        (busy, held)
    }
}

/// The registry and what is kept between scrapes.
pub struct Metrics {
    registry: Registry,
    jobs: Family<StateLabel, Gauge>,
    pending: Family<ReasonLabel, Gauge>,
    nodes: Family<StateLabel, Gauge>,
    gpus_total: Gauge,
    gpus_allocated: GaugeF,
    fragmentation: GaugeF,
    utilization: GaugeF,
    allocation: GaugeF,
    user_gpus: Family<UserLabel, GaugeF>,
    user_gpu_seconds: Family<UserLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
    account_gpus: Family<AccountLabel, GaugeF>,
    account_gpu_seconds: Family<AccountLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
    account_borrowed: Family<AccountLabel, GaugeF>,
    account_borrowed_seconds: Family<AccountLabel, Counter<f64, std::sync::atomic::AtomicU64>>,
    slices: Family<StateLabel, Gauge>,
    /// Dynamic MIG's layout changes (the cluster's count, followed at scrapes).
    mig_reconfigurations: Counter,
    /// When GPU-seconds were last added (ms), to integrate running GPUs over time.
    last_ms: Mutex<Option<i64>>,
    pub submits: Counter,
    pub submits_deferred: Counter,
    pub pass_seconds: Histogram,
    pub commit_seconds: Histogram,
    /// Raft (replicated controllers; one controller: leader, term 0).
    pub raft: RaftGauges,
    conns: gpuctl_proto::guard_metrics::Connections,
}

impl Metrics {
    pub fn new(commit_seconds: Histogram) -> Arc<Metrics> {
        let mut r = Registry::default();
        let jobs = Family::<StateLabel, Gauge>::default();
        r.register(
            "gpuctl_jobs",
            "Jobs by state (finished ones as retained)",
            jobs.clone(),
        );
        let pending = Family::<ReasonLabel, Gauge>::default();
        r.register(
            "gpuctl_jobs_pending",
            "Pending jobs by reason",
            pending.clone(),
        );
        let nodes = Family::<StateLabel, Gauge>::default();
        r.register("gpuctl_nodes", "Nodes by state", nodes.clone());
        let gpus_total = Gauge::default();
        r.register(
            "gpuctl_gpus",
            "GPUs of the nodes that are up",
            gpus_total.clone(),
        );
        let gpus_allocated = GaugeF::default();
        r.register(
            "gpuctl_gpus_allocated",
            "Allocated GPU capacity in GPUs (shares and MIG instances as fractions)",
            gpus_allocated.clone(),
        );
        let fragmentation = GaugeF::default();
        r.register(
            "gpuctl_fragmentation_gpus",
            "Idle GPU capacity the typical job mix could not use (FGD's measure), in GPUs",
            fragmentation.clone(),
        );
        let utilization = GaugeF::default();
        r.register(
            "gpuctl_cluster_gpu_utilization_ratio",
            "Busy fraction of the GPUs of up nodes that reported a sample, averaged over them (0-1; docs/utilisation.md)",
            utilization.clone(),
        );
        let allocation = GaugeF::default();
        r.register(
            "gpuctl_cluster_gpu_allocation_ratio",
            "Allocated GPU capacity over the GPUs of up nodes (0-1; docs/utilisation.md)",
            allocation.clone(),
        );
        let user_gpus = Family::<UserLabel, GaugeF>::default();
        r.register(
            "gpuctl_user_running_gpus",
            "GPUs held by each user's running jobs (shares as fractions)",
            user_gpus.clone(),
        );
        let user_gpu_seconds = Family::default();
        r.register(
            "gpuctl_user_gpu_seconds",
            "GPU-seconds held by each user's running jobs since the controller started (sampled at scrapes)",
            user_gpu_seconds.clone(),
        );
        let account_gpus = Family::<AccountLabel, GaugeF>::default();
        r.register(
            "gpuctl_account_running_gpus",
            "GPUs held by each account's running jobs (shares as fractions)",
            account_gpus.clone(),
        );
        let account_gpu_seconds = Family::default();
        r.register(
            "gpuctl_account_gpu_seconds",
            "GPU-seconds held by each account's running jobs since the controller started (sampled at scrapes)",
            account_gpu_seconds.clone(),
        );
        let account_borrowed = Family::<AccountLabel, GaugeF>::default();
        r.register(
            "gpuctl_account_borrowed_gpus",
            "GPUs each account's opportunistic jobs run on in borrowed idle (shares as fractions; not counted as allocated)",
            account_borrowed.clone(),
        );
        let account_borrowed_seconds = Family::default();
        r.register(
            "gpuctl_account_borrowed_gpu_seconds",
            "GPU-seconds each account's opportunistic jobs ran in borrowed idle since the controller started (sampled at scrapes)",
            account_borrowed_seconds.clone(),
        );
        let slices = Family::<StateLabel, Gauge>::default();
        r.register(
            "gpuctl_slices",
            "GPU slices: state=mig_total, mig_allocated (MIG instances of up nodes and those held), shared_gpus (GPUs holding fractional shares), share_jobs (the share allocations on them), mig_changing (GPUs whose MIG layout is being changed)",
            slices.clone(),
        );
        let mig_reconfigurations = Counter::default();
        r.register(
            "gpuctl_mig_reconfigurations",
            "MIG layout changes the controller asked of dynamic-MIG nodes since it started",
            mig_reconfigurations.clone(),
        );
        let submits = Counter::default();
        r.register("gpuctl_submits", "Jobs acknowledged", submits.clone());
        let submits_deferred = Counter::default();
        r.register(
            "gpuctl_submits_deferred",
            "Submits whose scheduling pass waited (up to 1 s) because no GPU was free",
            submits_deferred.clone(),
        );
        let pass_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        r.register(
            "gpuctl_schedule_pass_seconds",
            "How long a scheduling pass took",
            pass_seconds.clone(),
        );
        r.register(
            "gpuctl_store_commit_seconds",
            "How long a durable commit (group flush) took",
            commit_seconds.clone(),
        );
        let raft = RaftGauges::register(&mut r);
        let conns = gpuctl_proto::guard_metrics::Connections::default();
        conns.register(&mut r);
        Arc::new(Metrics {
            conns,
            registry: r,
            jobs,
            pending,
            nodes,
            gpus_total,
            gpus_allocated,
            utilization,
            allocation,
            fragmentation,
            user_gpus,
            user_gpu_seconds,
            account_gpus,
            account_gpu_seconds,
            account_borrowed,
            account_borrowed_seconds,
            slices,
            mig_reconfigurations,
            last_ms: Mutex::new(None),
            submits,
            submits_deferred,
            pass_seconds,
            commit_seconds,
            raft,
        })
    }

    /// The exposition text for the state in `s` at `now_ms`.
    /// Exports `stats`' counters with the rest.
    pub fn watch_listener(&self, stats: Arc<gpuctl_proto::guard::Stats>) {
        self.conns.watch(stats);
    }

    pub fn render(&self, s: &Snapshot, now_ms: i64) -> String {
        self.conns.update();
        self.jobs.clear();
        for (k, v) in &s.jobs_by_state {
            self.jobs
                .get_or_create(&StateLabel { state: k.clone() })
                .set(*v as i64);
        }
        self.pending.clear();
        for (k, v) in &s.pending_by_reason {
            let l = ReasonLabel { reason: k.clone() };
            self.pending.get_or_create(&l).set(*v as i64);
        }
        self.nodes.clear();
        for (k, v) in &s.nodes_by_state {
            self.nodes
                .get_or_create(&StateLabel { state: k.clone() })
                .set(*v as i64);
        }
        self.gpus_total.set(s.gpus_total as i64);
        self.gpus_allocated.set(s.gpus_allocated);
        self.fragmentation.set(s.fragmentation_gpus);
        let (busy, held) = s.cluster_ratios();
        self.utilization.set(busy);
        self.allocation.set(held);
        self.user_gpus.clear();
        let mut last = self.last_ms.lock().unwrap_or_else(|p| p.into_inner());
        let dt = last.map_or(0.0, |l| (now_ms - l).max(0) as f64 / 1000.0);
        *last = Some(now_ms);
        for (user, gpus) in &s.running_gpus_by_user {
            let l = UserLabel { user: user.clone() };
            self.user_gpus.get_or_create(&l).set(*gpus);
            self.user_gpu_seconds.get_or_create(&l).inc_by(gpus * dt);
        }
        self.account_gpus.clear();
        for (account, gpus) in &s.running_gpus_by_account {
            let l = AccountLabel {
                account: account.clone(),
            };
            self.account_gpus.get_or_create(&l).set(*gpus);
            self.account_gpu_seconds.get_or_create(&l).inc_by(gpus * dt);
        }
        self.account_borrowed.clear();
        for (account, gpus) in &s.borrowed_gpus_by_account {
            let l = AccountLabel {
                account: account.clone(),
            };
            self.account_borrowed.get_or_create(&l).set(*gpus);
            self.account_borrowed_seconds
                .get_or_create(&l)
                .inc_by(gpus * dt);
        }
        for (state, v) in [
            ("mig_total", s.mig_instances),
            ("mig_allocated", s.mig_instances_allocated),
            ("shared_gpus", s.shared_gpus),
            ("share_jobs", s.share_slots),
            ("mig_changing", s.mig_changing),
        ] {
            let l = StateLabel {
                state: state.into(),
            };
            self.slices.get_or_create(&l).set(v as i64);
        }
        let seen = self.mig_reconfigurations.get();
        self.mig_reconfigurations
            .inc_by(s.mig_reconfigurations.saturating_sub(seen));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_renders_every_family_and_integrates_gpu_seconds() {
        let m = Metrics::new(Histogram::new(exponential_buckets(0.001, 2.0, 4)));
        let mut s = Snapshot {
            gpus_total: 8,
            gpus_allocated: 2.25,
            fragmentation_gpus: 0.5,
            gpu_util_mean: Some(45.0),
            ..Snapshot::default()
        };
        s.jobs_by_state.insert("RUNNING".into(), 3);
        s.pending_by_reason.insert("Resources".into(), 2);
        s.nodes_by_state.insert("MIXED".into(), 1);
        s.running_gpus_by_user.insert("alice".into(), 2.0);
        s.running_gpus_by_account.insert("risk".into(), 2.0);
        s.borrowed_gpus_by_account.insert("research".into(), 0.5);
        s.mig_instances = 7;
        s.mig_instances_allocated = 3;
        m.submits.inc();
        m.pass_seconds.observe(0.003);
        let _ = m.render(&s, 1_000);
        let text = m.render(&s, 11_000);
        for line in [
            "gpuctl_jobs{state=\"RUNNING\"} 3",
            "gpuctl_jobs_pending{reason=\"Resources\"} 2",
            "gpuctl_nodes{state=\"MIXED\"} 1",
            "gpuctl_gpus 8",
            "gpuctl_gpus_allocated 2.25",
            "gpuctl_fragmentation_gpus 0.5",
            "gpuctl_cluster_gpu_utilization_ratio 0.45",
            "gpuctl_cluster_gpu_allocation_ratio 0.28125",
            "gpuctl_user_running_gpus{user=\"alice\"} 2.0",
            "gpuctl_user_gpu_seconds_total{user=\"alice\"} 20.0",
            "gpuctl_account_running_gpus{account=\"risk\"} 2.0",
            "gpuctl_account_gpu_seconds_total{account=\"risk\"} 20.0",
            "gpuctl_account_borrowed_gpus{account=\"research\"} 0.5",
            "gpuctl_account_borrowed_gpu_seconds_total{account=\"research\"} 5.0",
            "gpuctl_slices{state=\"mig_total\"} 7",
            "gpuctl_slices{state=\"mig_allocated\"} 3",
            "gpuctl_submits_total 1",
            "gpuctl_schedule_pass_seconds_count 1",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        // One full stop at the end of each HELP (the encoder adds it).
        assert!(!text.contains("..\n"), "{text}");
    }
}
