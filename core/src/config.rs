//! The controller's configuration: a TOML file with embedded defaults.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use gpuctl_sched::packing::Policy;
use gpuctl_sched::priority::PriorityWeights;

/// The `[mail]` table.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct MailConfig {
    /// The program mail goes through, run as `PROGRAM -s SUBJECT RECIPIENT` (like
    /// Slurm's MailProg: `/usr/bin/mail`); empty: no mail is sent.
    pub program: String,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Time limit of jobs that set none.
    #[serde(with = "humantime_serde")]
    pub default_time_limit: Duration,
    /// Between SIGTERM and SIGKILL when a job is cancelled or times out.
    #[serde(with = "humantime_serde")]
    pub kill_grace: Duration,
    /// A scheduling pass runs on every event and at least this often.
    #[serde(with = "humantime_serde")]
    pub sched_interval: Duration,
    /// An agent silent (no heartbeat, no stream) this long has failed: its node goes DOWN
    /// and its jobs end NODE_FAIL (or are requeued when their job file says so).
    #[serde(with = "humantime_serde")]
    pub node_timeout: Duration,
    /// Users who may act on every job, drain nodes and manage tokens (root always may).
    pub admins: Vec<String>,
    pub scheduler: SchedulerConfig,
    pub limits: Limits,
    /// The QoS levels jobs may name (`qos = "..."`), and who may use each:
    /// `[qos.high]` with `priority = 10000` and `allowed_users = ["alice"]`. Unknown
    /// names are refused at submit. When no `[qos]` table is given, the built-in levels
    /// are `low` (0) and `normal` (1000), open to everyone, and `high` (10000), for
    /// admins only.
    pub qos: BTreeMap<String, QosConfig>,
    pub retention: Retention,
    pub health: Health,
    /// Idle allocations (`crate::idle`): `[idle]` with `after = "30m"`, `util_below = 5`,
    /// `action = "warn" | "requeue" | "cancel"`, `exempt_qos`, `exempt_partitions`.
    pub idle: crate::idle::IdlePolicy,
    pub fairshare: FairShare,
    pub preemption: Preemption,
    /// Co-location by measured use (`crate::colocate`): `[colocation]` with `enabled`,
    /// `compute_overcommit = 2.0`, `min_run = "1m"`.
    pub colocation: crate::colocate::Colocation,
    /// The opportunistic class (`crate::opportunistic`): `[opportunistic]` with
    /// `enabled`, `lend_below = 0.6`, `yield_above = 0.8`, `measure = "5m"`,
    /// `yield_window = "10s"`, `memory_margin = 1.25`, `min_memory_mib = 2048`.
    pub opportunistic: crate::opportunistic::Opportunistic,
    /// Dynamic MIG (`crate::mig`): `[mig]` with `min_layout_age = "2m"`.
    pub mig: crate::mig::MigConfig,
    /// Mail about jobs (`crate::mail`): `[mail]` with `program` (empty: none sent).
    pub mail: MailConfig,
    /// Accounts (Slurm's associations): `[accounts.risk]` with `shares = 3` and
    /// `users = ["alice", "bob"]`. A job is charged to the account it names, or to the
    /// first account that lists its user, or, when none does, to an account named
    /// after the user.
    /// In the file's order (the first account listing a user is their default).
    pub accounts: indexmap::IndexMap<String, AccountConfig>,
    /// Partitions (`crate::partitions`): `[partitions.inference]` with `nodes =
    /// ["gpu[01-04]"]`, `max_time`, `allowed_accounts`, `default_qos`. Without a
    /// partition marked `default = true`, jobs that name none go to `default`, which
    /// holds every node.
    pub partitions: BTreeMap<String, crate::partitions::PartitionConfig>,
    /// The IANA time zone of `[windows]` times (default UTC).
    pub timezone: String,
    /// Time-of-day windows (`crate::windows`).
    pub windows: BTreeMap<String, crate::windows::Window>,
    /// `timezone`, resolved at load.
    #[serde(skip, default = "utc")]
    pub tz: jiff::tz::TimeZone,
    /// Added to `now` where windows are evaluated: `gpuctld --fake-time` for tests.
    #[serde(skip)]
    pub clock_offset_ms: i64,
    /// The same as `limits.max_time_limit`, at the top level (either may be given).
    #[serde(with = "humantime_serde", default)]
    pub max_time_limit: Option<Duration>,
}

/// The `[health]` table: what drains a node by itself (and lifts the drain once the
/// node is healthy again; an admin's drain is never lifted by it).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Health {
    /// A GPU hotter than this (°C) drains its node; 0 turns the check off.
    pub max_gpu_temp_c: u32,
    /// The drain is lifted when every GPU of the node is at or below this.
    pub resume_gpu_temp_c: u32,
    /// XID errors that mean the GPU is broken (hardware): its node is drained (an admin
    /// resumes it after the GPU is reset or replaced) and the jobs on that GPU are
    /// requeued when they allow it, else ended. Default: NVIDIA's "reset or replace"
    /// class (48 double-bit ECC, 61-64 and 74 NVLink/firmware, 79 fallen off the bus,
    /// 92/94/95 ECC, 119/120 GSP).
    pub xid_drain: Vec<u32>,
    /// XID errors a job causes (13, 31, 43, 45, 68): a warning on the jobs of that GPU,
    /// no drain.
    pub xid_job: Vec<u32>,
    /// A GPU reporting uncorrectable (double-bit) volatile ECC errors drains its node
    /// until the count is back to zero (a GPU reset clears it).
    pub ecc_drain: bool,
    /// A GPU drawing more than this (W) drains its node until every GPU is at or below
    /// 95% of it; 0 turns the check off.
    pub max_gpu_power_w: u32,
    /// A GPU whose row remapping failed drains its node (its memory needs service).
    pub remap_failure_drain: bool,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            max_gpu_temp_c: 90,
            resume_gpu_temp_c: 80,
            xid_drain: vec![48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120],
            xid_job: vec![13, 31, 43, 45, 68],
            ecc_drain: true,
            max_gpu_power_w: 0,
            remap_failure_drain: true,
        }
    }
}

/// The `[retention]` table: how long finished jobs are kept (for `show`, `queue
/// --all` and dependencies). A finished job keeps its metadata only: its env, script
/// and command arguments are dropped when it ends.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Retention {
    /// Finished jobs older than this (since their end) are removed.
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    /// At most this many finished jobs are kept (the oldest go first).
    pub max_jobs: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_age: Duration::from_secs(30 * 24 * 3600),
            max_jobs: 100_000,
        }
    }
}

fn utc() -> jiff::tz::TimeZone {
    jiff::tz::TimeZone::UTC
}

/// The `[fairshare]` table.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FairShare {
    /// Usage counts half after this long (Slurm's PriorityDecayHalfLife).
    #[serde(with = "humantime_serde")]
    pub half_life: Duration,
    /// What a GPU-second of a model costs (case-insensitive substrings of the model
    /// name, first match wins); models not named cost 1.
    pub model_weights: BTreeMap<String, f64>,
}

impl Default for FairShare {
    fn default() -> Self {
        FairShare {
            half_life: Duration::from_secs(7 * 24 * 3600),
            model_weights: BTreeMap::new(),
        }
    }
}

impl FairShare {
    pub fn model_weight(&self, model: &str) -> f64 {
        self.model_weights
            .iter()
            .find(|(k, _)| gpuctl_sched::models_allow(std::slice::from_ref(*k), model))
            .map_or(1.0, |(_, w)| *w)
    }
}

/// The `[preemption]` table: a job of a QoS that `preempts` others may stop their
/// running jobs to start (each QoS's `preempts` says whose).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Preemption {
    pub enabled: bool,
    /// A job that has run less than this is never preempted.
    #[serde(with = "humantime_serde")]
    pub min_run: Duration,
    /// At most this many waiting jobs preempt in one pass.
    pub max_per_pass: usize,
    /// A window's floor lends its idle GPUs to jobs that give them back (a job file's
    /// `requeue` with a checkpoint `signal` whose lead fits `reclaim_within`).
    pub lend_floors: bool,
    /// The floor's owner starts within this of its submit while borrowers hold its
    /// GPUs (their signal, lead and kill, and the pass that starts it).
    #[serde(with = "humantime_serde")]
    pub reclaim_within: Duration,
}

impl Default for Preemption {
    fn default() -> Self {
        Preemption {
            enabled: true,
            min_run: Duration::from_secs(300),
            max_per_pass: 8,
            lend_floors: true,
            reclaim_within: Duration::from_secs(120),
        }
    }
}

impl Preemption {
    /// What is wrong with the table, if anything.
    pub fn check(&self) -> Result<(), String> {
        if self.reclaim_within < Duration::from_secs(30) {
            return Err(format!(
                "preemption.reclaim_within = {}: at least 30s (a borrower needs its signal's lead, and a pass may come sched_interval late)",
                humantime::format_duration(self.reclaim_within)
            ));
        }
        Ok(())
    }
}

/// One `[accounts.NAME]` table.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AccountConfig {
    /// Its shares of the cluster (fair share); 1 when not given.
    pub shares: Option<u32>,
    /// Users who may charge it (admins may charge any account).
    pub users: Vec<String>,
    /// Shares of its users within it; 1 each when not given.
    pub user_shares: BTreeMap<String, u32>,
}

/// One `[qos.NAME]` table.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QosConfig {
    /// Its value in the multifactor priority (times `scheduler.priority.qos`).
    pub priority: i64,
    /// Who may submit with it besides admins; absent = everyone.
    #[serde(default)]
    pub allowed_users: Option<Vec<String>>,
    /// Which accounts may charge jobs of it; absent = every account.
    #[serde(default)]
    pub allowed_accounts: Option<Vec<String>>,
    /// The QoS levels whose running jobs a job of this one may preempt.
    #[serde(default)]
    pub preempts: Vec<String>,
    /// The most GPUs one user may hold with jobs of this QoS at once (normalised: a
    /// quarter share counts 0.25, a MIG instance its fraction of the GPU).
    #[serde(default)]
    pub max_gpus_per_user: Option<f64>,
    /// The same for one account.
    #[serde(default)]
    pub max_gpus_per_account: Option<f64>,
    /// The longest time limit a job of this QoS may ask for.
    #[serde(default, with = "humantime_serde")]
    pub max_time: Option<Duration>,
    /// Its jobs are of the opportunistic class (`crate::opportunistic`): they run only
    /// in the idle of GPUs others hold, and yield.
    #[serde(default)]
    pub opportunistic: bool,
}

impl QosConfig {
    /// A QoS of this priority open to everyone, without caps.
    pub fn open(priority: i64) -> QosConfig {
        QosConfig {
            priority,
            allowed_users: None,
            allowed_accounts: None,
            preempts: Vec::new(),
            max_gpus_per_user: None,
            max_gpus_per_account: None,
            max_time: None,
            opportunistic: false,
        }
    }

    pub fn allows(&self, user: &str, admin: bool) -> bool {
        admin
            || self
                .allowed_users
                .as_ref()
                .is_none_or(|u| u.iter().any(|x| x == user))
    }

    pub fn allows_account(&self, account: &str) -> bool {
        self.allowed_accounts
            .as_ref()
            .is_none_or(|a| a.iter().any(|x| x == account))
    }
}

/// The QoS a job without one gets (when the config has it).
pub const DEFAULT_QOS: &str = "normal";

fn default_qos() -> BTreeMap<String, QosConfig> {
    [
        ("low".to_string(), QosConfig::open(0)),
        ("normal".to_string(), QosConfig::open(1000)),
        (
            "high".to_string(),
            QosConfig {
                allowed_users: Some(Vec::new()),
                preempts: vec!["low".to_string()],
                ..QosConfig::open(10_000)
            },
        ),
    ]
    .into_iter()
    .collect()
}

/// The `[limits]` table: what one request may ask for.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest gRPC request the controller decodes.
    pub max_message_bytes: bytesize::ByteSize,
    /// Largest job (the encoded job spec: command or script, env, paths).
    pub max_job_bytes: bytesize::ByteSize,
    /// Most entries in a job's lists (command arguments, env variables, GPU models).
    pub max_list_len: usize,
    /// Most pending jobs one user may have; a submit past it is refused.
    pub max_pending_per_user: usize,
    /// Most tasks one job array may have.
    pub max_array_tasks: usize,
    /// Longest time limit a job may ask for (and the cap of `default_time_limit`).
    #[serde(with = "humantime_serde")]
    pub max_time_limit: Duration,
    /// Submits are refused while the state dir's filesystem has less free than this,
    /// so that the store never runs into a full disk (job ends and node updates, which
    /// are small, are still written).
    pub min_free_disk: bytesize::ByteSize,
    /// Open connections each TCP listener (gRPC, metrics, web) holds at most.
    pub max_connections: usize,
    /// Open connections from one peer address per listener (a node's agent and its
    /// users' CLIs share their node's address); on the Unix socket, from one uid.
    pub max_connections_per_address: usize,
    /// A new connection must send its first request's headers within this.
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// A connection silent this long is closed (live clients answer keepalive pings).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// File descriptors new connections may never take: the Unix socket, agents'
    /// streams and the store keep working while a flood is refused.
    pub reserved_fds: u64,
    /// Connections of the gRPC listener's `max_connections` that only authenticated
    /// peers (agents and members with their certificates, requests with a valid token)
    /// may take. The per-address caps count only unauthenticated connections.
    pub authenticated_reserve: usize,
    /// A gRPC connection that has not authenticated (no client certificate, no request
    /// with a valid token or signature) this long after it was accepted is closed.
    #[serde(with = "humantime_serde")]
    pub unauthenticated_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: bytesize::ByteSize::mib(4),
            max_job_bytes: bytesize::ByteSize::kib(256),
            max_list_len: 4096,
            max_pending_per_user: 10_000,
            max_array_tasks: 10_000,
            max_time_limit: Duration::from_secs(30 * 24 * 3600),
            min_free_disk: bytesize::ByteSize::mib(64),
            max_connections: 16_384,
            max_connections_per_address: 256,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            reserved_fds: 512,
            authenticated_reserve: 2048,
            unauthenticated_timeout: Duration::from_secs(10),
        }
    }
}

/// The `[scheduler]` table.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// `first-fit`, `best-fit` or `fgd`.
    pub packing: String,
    /// Conservative backfill on (default) or strict priority order.
    pub backfill: bool,
    /// How many blocked jobs get reservations; unset = all.
    pub reservation_depth: Option<usize>,
    /// Best-fit/FGD score at most this many feasible nodes per job (0 = all).
    #[serde(deserialize_with = "zero_is_all")]
    pub max_scored_nodes: Option<usize>,
    /// How often a pass plans every waiting job (reservations, so expected starts:
    /// `queue --start`), like Slurm's `bf_interval`. The passes in between stop once no
    /// job left can start now (the same starts) and leave the rest's expected starts as
    /// the last full pass gave them. Zero: every pass.
    #[serde(with = "humantime_serde")]
    pub expected_starts_every: Duration,
    pub priority: PriorityWeights,
}

fn zero_is_all<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let n = usize::deserialize(d)?;
    Ok((n > 0).then_some(n))
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            packing: Policy::default().to_string(),
            backfill: true,
            reservation_depth: None,
            max_scored_nodes: Some(64),
            expected_starts_every: Duration::from_secs(10),
            priority: PriorityWeights::default(),
        }
    }
}

impl SchedulerConfig {
    pub fn policy(&self) -> Result<Policy, String> {
        self.packing.parse()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            default_time_limit: Duration::from_secs(3600),
            kill_grace: Duration::from_secs(10),
            sched_interval: Duration::from_secs(10),
            node_timeout: Duration::from_secs(60),
            admins: Vec::new(),
            scheduler: SchedulerConfig::default(),
            limits: Limits::default(),
            qos: default_qos(),
            retention: Retention::default(),
            health: Health::default(),
            idle: crate::idle::IdlePolicy::default(),
            fairshare: FairShare::default(),
            preemption: Preemption::default(),
            colocation: crate::colocate::Colocation::default(),
            opportunistic: crate::opportunistic::Opportunistic::default(),
            mig: crate::mig::MigConfig::default(),
            mail: MailConfig::default(),
            accounts: indexmap::IndexMap::new(),
            partitions: BTreeMap::new(),
            timezone: "UTC".into(),
            windows: BTreeMap::new(),
            tz: utc(),
            clock_offset_ms: 0,
            max_time_limit: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: toml::de::Error,
    },
    #[error("config {path}: {why}")]
    Invalid { path: String, why: String },
}

impl Config {
    /// The account a job of `user` is charged to when it names none.
    pub fn default_account(&self, user: &str) -> String {
        self.accounts
            .iter()
            .find(|(_, a)| a.users.iter().any(|u| u == user))
            .map_or_else(|| user.to_string(), |(name, _)| name.clone())
    }

    /// Whether `user` may charge `account`: an account that lists them; a user no
    /// account lists, their own name. (A user listed in an account charging an account
    /// named after themselves would escape that account's caps.)
    pub fn may_charge(&self, user: &str, account: &str, admin: bool) -> bool {
        let listed = || {
            self.accounts
                .values()
                .any(|a| a.users.iter().any(|u| u == user))
        };
        match self.accounts.get(account) {
            _ if admin => true,
            Some(a) => a.users.iter().any(|u| u == user),
            None => self.accounts.is_empty() || (account == user && !listed()),
        }
    }

    /// One source of truth for QoS: a config that names levels only the old way
    /// (`scheduler.priority.qos_levels`) gets them as open QoS; otherwise the
    /// priorities of `[qos]` become the levels the scheduler weighs.
    pub fn resolve_qos(&mut self) {
        let levels = &self.scheduler.priority.qos_levels;
        let default_levels = gpuctl_sched::priority::PriorityWeights::default().qos_levels;
        if *levels != default_levels && self.qos == default_qos() {
            self.qos = levels
                .iter()
                .map(|(k, &priority)| (k.clone(), QosConfig::open(priority)))
                .collect();
        }
        self.scheduler.priority.qos_levels = self
            .qos
            .iter()
            .map(|(k, q)| (k.clone(), q.priority))
            .collect();
    }

    /// The configuration as TOML, every key with its value (`gpuctld config`).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a config serialises to TOML")
    }

    /// A configuration from `to_toml`'s text (a reconfigure in the log).
    pub fn from_toml(text: &str) -> Result<Config, String> {
        let mut config: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        config.resolve_qos();
        // Not serialised: resolved again, or a replica's windows would run on UTC.
        config.tz = crate::windows::zone(&config.timezone)?;
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut config: Config = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source,
        })?;
        let invalid = |why: String| ConfigError::Invalid {
            path: path.display().to_string(),
            why,
        };
        if let Some(max) = config.max_time_limit {
            config.limits.max_time_limit = max;
        }
        if config.default_time_limit > config.limits.max_time_limit {
            return Err(invalid(format!(
                "default_time_limit {} is over limits.max_time_limit {}",
                humantime::format_duration(config.default_time_limit),
                humantime::format_duration(config.limits.max_time_limit)
            )));
        }
        if config.limits.max_time_limit > Duration::from_secs(100 * 365 * 24 * 3600) {
            return Err(invalid("limits.max_time_limit is over 100 years".into()));
        }
        config.resolve_qos();
        for (name, q) in &config.qos {
            for p in &q.preempts {
                if !config.qos.contains_key(p) || p == name {
                    return Err(invalid(format!(
                        "qos.{name}.preempts names {p:?}, which is not another QoS of this config"
                    )));
                }
            }
            for (what, cap) in [
                ("max_gpus_per_user", q.max_gpus_per_user),
                ("max_gpus_per_account", q.max_gpus_per_account),
            ] {
                if cap.is_some_and(|c| !(c.is_finite() && (0.0..=1e9).contains(&c))) {
                    return Err(invalid(format!(
                        "qos.{name}.{what}: a number of GPUs from 0 on, please"
                    )));
                }
            }
        }
        config.check_partitions().map_err(&invalid)?;
        config.idle.check().map_err(&invalid)?;
        config.preemption.check().map_err(&invalid)?;
        config.colocation.check().map_err(&invalid)?;
        config.opportunistic.check().map_err(&invalid)?;
        config.tz = crate::windows::zone(&config.timezone).map_err(&invalid)?;
        for (name, w) in &config.windows {
            w.check(name).map_err(&invalid)?;
        }
        for (name, w) in &config.fairshare.model_weights {
            if !(w.is_finite() && *w >= 0.0) {
                return Err(invalid(format!(
                    "fairshare.model_weights.{name} = {w}: a weight is a number >= 0"
                )));
            }
        }
        config
            .scheduler
            .policy()
            .map_err(|why| ConfigError::Invalid {
                path: path.display().to_string(),
                why,
            })?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_config_keeps_defaults() {
        let c: Config = toml::from_str("kill_grace = \"2s\"").unwrap();
        assert_eq!(c.kill_grace, Duration::from_secs(2));
        assert_eq!(c.default_time_limit, Duration::from_secs(3600));
    }

    #[test]
    fn scheduler_table() {
        let c: Config = toml::from_str(
            "[scheduler]\npacking = \"best-fit\"\nreservation_depth = 5\n[scheduler.priority]\nage = 7\nqos_levels = { gold = 3 }\n",
        )
        .unwrap();
        assert_eq!(c.scheduler.policy().unwrap(), Policy::BestFit);
        assert_eq!(c.scheduler.reservation_depth, Some(5));
        assert_eq!(c.scheduler.priority.age, 7);
        assert_eq!(c.scheduler.priority.qos_levels["gold"], 3);
        assert_eq!(c.scheduler.priority.size, 500);
        assert!(c.scheduler.priority.favor_small);
    }

    #[test]
    fn limits_and_admins() {
        let c: Config = toml::from_str(
            "admins = [\"alice\"]\n[limits]\nmax_job_bytes = \"1KiB\"\nmax_pending_per_user = 3\n",
        )
        .unwrap();
        assert_eq!(c.admins, vec!["alice".to_string()]);
        assert_eq!(c.limits.max_job_bytes.as_u64(), 1024);
        assert_eq!(c.limits.max_pending_per_user, 3);
        assert_eq!(c.limits.max_list_len, 4096);
    }

    #[test]
    fn qos_tables_and_access() {
        let mut c: Config = toml::from_str(
            "[qos.gold]\npriority = 5\nallowed_users = [\"alice\"]\n[qos.open]\npriority = 1\n",
        )
        .unwrap();
        c.resolve_qos();
        assert_eq!(c.scheduler.priority.qos_levels["gold"], 5);
        assert!(!c.scheduler.priority.qos_levels.contains_key("high"));
        assert!(c.qos["gold"].allows("alice", false));
        assert!(!c.qos["gold"].allows("bob", false));
        assert!(c.qos["gold"].allows("bob", true));
        assert!(c.qos["open"].allows("bob", false));
        let d = Config::default();
        assert!(!d.qos["high"].allows("bob", false));
        assert!(d.qos["normal"].allows("bob", false));
        assert_eq!(d.limits.max_time_limit, Duration::from_secs(30 * 86400));
    }

    #[test]
    fn max_time_limit_at_the_top_or_in_limits() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "max_time_limit = \"7days\"\n").unwrap();
        let c = Config::load(&p).unwrap();
        assert_eq!(c.limits.max_time_limit, Duration::from_secs(7 * 86400));
        std::fs::write(&p, "[limits]\nmax_time_limit = \"2days\"\n").unwrap();
        let c = Config::load(&p).unwrap();
        assert_eq!(c.limits.max_time_limit, Duration::from_secs(2 * 86400));
        std::fs::write(&p, "max_time_limit = \"30m\"\n").unwrap();
        let e = Config::load(&p).unwrap_err().to_string();
        assert!(e.contains("default_time_limit 1h is over"), "{e}");
    }

    /// The example in docs/operations.md is a config that loads, as documented.
    #[test]
    fn the_documented_config_loads() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
        )
        .unwrap();
        let start = doc.find("```toml\n").unwrap() + "```toml\n".len();
        let end = start + doc[start..].find("```").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("gpuctld.toml");
        std::fs::write(&p, &doc[start..end]).unwrap();
        let c = Config::load(&p).unwrap();
        assert_eq!(c.qos["high"].preempts, vec!["low".to_string()]);
        assert_eq!(c.accounts["risk"].shares, Some(3));
        assert_eq!(c.windows["business"].floor["inference"], 0.7);
        assert_eq!(c.timezone, "Europe/London");
        assert_eq!(c.scheduler.priority.fair_share, 1000);
        assert_eq!(c.default_partition(), "batch");
        assert_eq!(c.partitions_of("gpu03"), vec!["batch", "inference"]);
        assert_eq!(c.partitions_of("a100-x"), vec!["batch", "inference"]);
        assert_eq!(c.partitions_of("gpu05"), vec!["batch"]);
        assert_eq!(c.idle.after, Some(Duration::from_secs(1800)));
        assert_eq!(c.idle.action, crate::idle::IdleAction::Warn);
    }

    /// Attack 4 of "Hardening, second round": bob, listed in `risk` (at its cap),
    /// charged `-A bob` and escaped the cap. And a user's default account is the first
    /// that lists them in the file, not the first by name.
    #[test]
    fn listed_users_charge_only_their_accounts_and_default_to_the_first_in_the_file() {
        let c: Config = toml::from_str(
            "[accounts.zeta]\nusers = [\"bob\"]\n[accounts.risk]\nusers = [\"bob\", \"alice\"]\n",
        )
        .unwrap();
        assert!(c.may_charge("bob", "risk", false));
        assert!(c.may_charge("bob", "zeta", false));
        assert!(
            !c.may_charge("bob", "bob", false),
            "listed: not their own name"
        );
        assert!(!c.may_charge("alice", "zeta", false));
        assert!(
            c.may_charge("carol", "carol", false),
            "listed nowhere: their own name"
        );
        assert!(!c.may_charge("carol", "risk", false));
        assert!(c.may_charge("root", "anything", true));
        assert_eq!(c.default_account("bob"), "zeta");
        assert_eq!(c.default_account("alice"), "risk");
        assert_eq!(c.default_account("carol"), "carol");
    }

    #[test]
    fn unknown_key_is_an_error() {
        assert!(toml::from_str::<Config>("kill_grase = \"2s\"").is_err());
    }
}
