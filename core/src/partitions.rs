//! Partitions (Slurm's): named node sets with their own default and maximum time
//! limits, allowed accounts, default QoS and state. A job names one (`partition =
//! "..."`, `sbatch -p`) or gets the default partition, which holds every node unless the
//! config says otherwise. The scheduler sees a partition as a node filter
//! (`Request::partition` against `NodeView::partitions`); the checks of a job against
//! its partition's limits are here.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use serde::Deserialize;

use crate::record::{JobSpec, JobState};
use gpuctl_sched::hostlist::is_name_char;
pub use gpuctl_sched::hostlist::{check_hostlist, hostlist_match};

use crate::config::Config;
use crate::error::{Actor, Refusal};
use crate::state::Cluster;
use crate::view::PartitionRow;

/// The partition of jobs that name none, when no `[partitions.NAME]` says `default =
/// true`: it holds every node and has no limits of its own.
pub const DEFAULT_PARTITION: &str = "default";

/// What a partition does with jobs (Slurm's `State=`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionState {
    /// Takes jobs and runs them.
    #[default]
    Up,
    /// Takes jobs; they wait (reason `PartitionDown`) until it is up again.
    Down,
    /// Takes no new jobs; those queued still run.
    Drain,
}

impl PartitionState {
    pub fn as_str(self) -> &'static str {
        match self {
            PartitionState::Up => "up",
            PartitionState::Down => "down",
            PartitionState::Drain => "drain",
        }
    }
}

/// One `[partitions.NAME]` table.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PartitionConfig {
    /// Which nodes: names, hostlists like Slurm's (`gpu[01-08,12]`), `*` globs; empty
    /// or `ALL` = every node.
    pub nodes: Vec<String>,
    /// The partition of jobs that name none (one at most).
    pub default: bool,
    /// The time limit of its jobs that give none (else the cluster's).
    #[serde(with = "humantime_serde")]
    pub default_time: Option<Duration>,
    /// The longest time limit its jobs may ask for.
    #[serde(with = "humantime_serde")]
    pub max_time: Option<Duration>,
    /// Accounts that may submit to it (admins always may); absent = every account.
    pub allowed_accounts: Option<Vec<String>>,
    /// The QoS of its jobs that name none (else `normal`).
    pub default_qos: Option<String>,
    pub state: PartitionState,
}

static IMPLICIT: LazyLock<PartitionConfig> = LazyLock::new(|| PartitionConfig {
    default: true,
    ..PartitionConfig::default()
});

impl PartitionConfig {
    /// Whether it holds every node (then the scheduler needs no filter).
    pub fn every_node(&self) -> bool {
        self.nodes.is_empty() || self.nodes.iter().any(|p| p == "ALL" || p == "*")
    }

    pub fn holds(&self, node: &str) -> bool {
        self.every_node() || self.nodes.iter().any(|p| hostlist_match(p, node))
    }

    pub fn allows_account(&self, account: &str) -> bool {
        self.allowed_accounts
            .as_ref()
            .is_none_or(|a| a.iter().any(|x| x == account))
    }
}

impl Config {
    /// The partition of jobs that name none.
    pub fn default_partition(&self) -> &str {
        self.partitions
            .iter()
            .find(|(_, p)| p.default)
            .map_or(DEFAULT_PARTITION, |(n, _)| n.as_str())
    }

    /// The partition a job's spec names, or the default one when it names none (jobs
    /// stored before partitions existed name none).
    pub fn partition_name<'a>(&'a self, named: &'a str) -> &'a str {
        if named.is_empty() {
            self.default_partition()
        } else {
            named
        }
    }

    /// A partition by name (the implicit default one too).
    pub fn partition(&self, name: &str) -> Option<&PartitionConfig> {
        self.partitions.get(name).or_else(|| {
            (name == DEFAULT_PARTITION && !self.partitions.values().any(|p| p.default))
                .then(|| &*IMPLICIT)
        })
    }

    /// Every partition, the implicit default one included, by name.
    pub fn all_partitions(&self) -> BTreeMap<&str, &PartitionConfig> {
        let mut all: BTreeMap<&str, &PartitionConfig> = self
            .partitions
            .iter()
            .map(|(n, p)| (n.as_str(), p))
            .collect();
        if let Some(p) = self.partition(DEFAULT_PARTITION) {
            all.insert(DEFAULT_PARTITION, p);
        }
        all
    }

    /// The partitions `node` is in.
    pub fn partitions_of(&self, node: &str) -> Vec<String> {
        partitions_holding(&self.all_partitions(), node)
    }

    /// The scheduler's node filter for a job of `partition`: `None` when it holds every
    /// node.
    pub fn partition_filter(&self, partition: &str) -> Option<String> {
        match self.partition(partition) {
            Some(p) if p.every_node() => None,
            _ => Some(partition.to_string()),
        }
    }

    /// Checks the `[partitions]` tables (at load), and that window floors name
    /// partitions that exist.
    pub fn check_partitions(&self) -> Result<(), String> {
        for (w, win) in &self.windows {
            for p in win.partition_floor.keys() {
                match self.partition(p) {
                    None => {
                        return Err(format!(
                            "windows.{w}.partition_floor names {p:?}, which is not a partition of this config"
                        ));
                    }
                    // GPUs kept anywhere serve only jobs that may run anywhere.
                    Some(part) if !part.every_node() => {
                        return Err(format!(
                            "windows.{w}.partition_floor: partition {p:?} holds only some nodes; a floor keeps GPUs anywhere in the cluster, so it is for partitions of every node (or use an account's floor)"
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        let defaults: Vec<&String> = self
            .partitions
            .iter()
            .filter(|(_, p)| p.default)
            .map(|(n, _)| n)
            .collect();
        if defaults.len() > 1 {
            return Err(format!(
                "partitions {} all say default = true; one at most may",
                defaults
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for (name, p) in &self.partitions {
            if name.is_empty() || name.len() > 64 || !name.chars().all(is_name_char) {
                return Err(format!(
                    "partition {name:?}: a name is 1-64 letters, digits, '-', '_' or '.'"
                ));
            }
            for pat in &p.nodes {
                check_hostlist(pat).map_err(|why| format!("partitions.{name}.nodes: {why}"))?;
            }
            if let Some(q) = &p.default_qos
                && !self.qos.contains_key(q)
            {
                return Err(format!(
                    "partitions.{name}.default_qos names {q:?}, which is not a QoS of this config"
                ));
            }
            if let (Some(d), Some(m)) = (p.default_time, p.max_time)
                && d > m
            {
                return Err(format!(
                    "partitions.{name}: default_time {} is over max_time {}",
                    humantime::format_duration(d),
                    humantime::format_duration(m)
                ));
            }
            if p.max_time.is_some_and(|m| m.is_zero()) {
                return Err(format!("partitions.{name}.max_time is 0"));
            }
        }
        Ok(())
    }
}

/// The names of the partitions of `all` (`Config::all_partitions`) that hold `node`:
/// build `all` once when asking for many nodes.
pub fn partitions_holding(all: &BTreeMap<&str, &PartitionConfig>, node: &str) -> Vec<String> {
    all.iter()
        .filter(|(_, p)| p.holds(node))
        .map(|(n, _)| n.to_string())
        .collect()
}

/// Why a pending job of a partition is left out of passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// Its partition is not in the config any more.
    Gone,
    /// Its partition is down.
    Down,
    /// Its time limit is over the partition's `max_time` (lowered since its submit).
    TimeLimit,
}

impl Blocked {
    /// The job's REASON (Slurm's names).
    pub fn reason(self) -> &'static str {
        match self {
            Blocked::Gone => "PartitionConfig",
            Blocked::Down => "PartitionDown",
            Blocked::TimeLimit => "PartitionTimeLimit",
        }
    }

    /// What `gpuctl explain` says of it, for a job of `partition`.
    pub fn summary(self, partition: &str) -> String {
        match self {
            Blocked::Down => format!(
                "partition {partition} is down: its jobs wait until it is up (partitions.{partition}.state)"
            ),
            Blocked::TimeLimit => format!(
                "its time limit is over partition {partition}'s max_time (partitions.{partition}.max_time); ask an admin, or cancel and resubmit shorter"
            ),
            Blocked::Gone => format!(
                "partition {partition:?} is not in the controller's config any more; cancel and resubmit to another"
            ),
        }
    }
}

/// Why a pending job of a partition may not be scheduled now (`None`: it may).
pub fn blocked_by(cfg: &Config, spec: &JobSpec, time_limit_secs: u64) -> Option<Blocked> {
    let Some(p) = cfg.partition(cfg.partition_name(&spec.partition)) else {
        return Some(Blocked::Gone);
    };
    if p.state == PartitionState::Down {
        return Some(Blocked::Down);
    }
    if p.max_time.is_some_and(|m| time_limit_secs > m.as_secs()) {
        return Some(Blocked::TimeLimit);
    }
    None
}

impl Cluster {
    /// Fills in a submitted spec's partition (the default one when it names none) and
    /// the QoS its partition gives, and checks the job against the partition: it
    /// exists, takes new jobs, and allows the account and the time limit. Returns the
    /// job's time limit when it gave none (the partition's default).
    pub(crate) fn admit_partition(
        &self,
        actor: &Actor,
        spec: &mut JobSpec,
    ) -> Result<Option<u64>, Refusal> {
        let cfg = &self.config;
        let name = cfg.partition_name(&spec.partition).to_string();
        spec.partition.clone_from(&name);
        let Some(p) = cfg.partition(&name) else {
            let known: Vec<&str> = cfg.all_partitions().into_keys().collect();
            return Err(Refusal::invalid_argument(format!(
                "unknown partition {:?}; this cluster has: {}",
                name.chars().take(64).collect::<String>(),
                known.join(", ")
            )));
        };
        if p.state == PartitionState::Drain {
            return Err(Refusal::failed_precondition(format!(
                "partition {name:?} is draining: it takes no new jobs (partitions.{name}.state)"
            )));
        }
        if spec.qos.is_empty()
            && let Some(q) = &p.default_qos
        {
            spec.qos.clone_from(q);
        }
        if !actor.admin && !p.allows_account(&spec.account) {
            return Err(Refusal::permission_denied(format!(
                "account {:?} may not use partition {name:?} (partitions.{name}.allowed_accounts)",
                spec.account
            )));
        }
        let asked = spec.resources.time_limit_secs;
        if let Some(max) = p.max_time
            && asked > max.as_secs()
        {
            return Err(Refusal::invalid_argument(format!(
                "time limit {} is over partition {name:?}'s maximum of {} (partitions.{name}.max_time)",
                humantime::format_duration(Duration::from_secs(asked.min(1 << 40))),
                humantime::format_duration(max)
            )));
        }
        if asked > 0 {
            return Ok(None);
        }
        let default = p.default_time.unwrap_or(cfg.default_time_limit);
        Ok(Some(
            p.max_time
                .map_or(default, |m| default.min(m))
                .as_secs()
                .max(1),
        ))
    }

    /// Pending jobs that their partition keeps out of passes (it is down, gone from the
    /// config, or its `max_time` is now under their limit), with the reason.
    pub fn partition_blocked(&self) -> Vec<(u64, Blocked)> {
        let cfg = &self.config;
        let restrictive = cfg
            .partitions
            .values()
            .any(|p| p.state == PartitionState::Down || p.max_time.is_some());
        let mut out = Vec::new();
        for s in self.jobs.active() {
            let j = &s.job;
            if j.state != JobState::Pending || !j.hold.is_empty() {
                continue;
            }
            let spec = &j.spec;
            let known = spec.partition.is_empty() || cfg.partition(&spec.partition).is_some();
            if !restrictive && known {
                continue;
            }
            if let Some(why) = blocked_by(cfg, spec, j.time_limit_secs) {
                out.push((j.id, why));
            }
        }
        out
    }

    /// The partitions, their nodes and jobs (`gpuctl partitions`).
    pub fn partition_rows(&self) -> Vec<PartitionRow> {
        let cfg = &self.config;
        let default = cfg.default_partition();
        let mut rows: BTreeMap<&str, (&PartitionConfig, PartitionRow)> = cfg
            .all_partitions()
            .into_iter()
            .map(|(name, p)| {
                let row = PartitionRow {
                    name: name.to_string(),
                    is_default: name == default,
                    state: p.state.as_str().into(),
                    node_patterns: p.nodes.clone(),
                    default_time_secs: p.default_time.map_or(0, |d| d.as_secs()),
                    max_time_secs: p.max_time.map_or(0, |d| d.as_secs()),
                    allowed_accounts: p.allowed_accounts.clone().unwrap_or_default(),
                    default_qos: p.default_qos.clone().unwrap_or_default(),
                    ..PartitionRow::default()
                };
                (name, (p, row))
            })
            .collect();
        for n in self.fleet.nodes.values() {
            for (p, row) in rows.values_mut() {
                if p.holds(&n.name) {
                    row.nodes.push(n.name.clone());
                    row.gpus += n.gpus.len() as u32;
                }
            }
        }
        for s in self.jobs.active() {
            let j = &s.job;
            let spec = &j.spec;
            if let Some((_, row)) = rows.get_mut(cfg.partition_name(&spec.partition)) {
                match j.state {
                    JobState::Pending => row.pending_jobs += 1,
                    JobState::Running => row.running_jobs += 1,
                    _ => {}
                }
            }
        }
        rows.into_values().map(|(_, row)| row).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_implicit_default_holds_every_node() {
        let c = Config::default();
        assert_eq!(c.default_partition(), DEFAULT_PARTITION);
        assert_eq!(c.partitions_of("n1"), vec!["default".to_string()]);
        assert_eq!(c.partition_filter("default"), None);
        let c: Config = toml::from_str(
            "[partitions.inference]\nnodes = [\"inf[1-2]\"]\n[partitions.batch]\ndefault = true\n",
        )
        .unwrap();
        assert_eq!(c.default_partition(), "batch");
        assert!(c.partition(DEFAULT_PARTITION).is_none());
        assert_eq!(c.partitions_of("inf1"), vec!["batch", "inference"]);
        assert_eq!(c.partitions_of("train1"), vec!["batch"]);
        assert_eq!(c.partition_filter("inference"), Some("inference".into()));
        assert_eq!(c.partition_filter("batch"), None);
        c.check_partitions().unwrap();
    }

    #[test]
    fn bad_partition_tables_are_refused() {
        for (text, want) in [
            (
                "[partitions.a]\ndefault = true\n[partitions.b]\ndefault = true\n",
                "one at most",
            ),
            ("[partitions.a]\nnodes = [\"x[1-\"]\n", "without ']'"),
            ("[partitions.a]\ndefault_qos = \"gold\"\n", "not a QoS"),
            (
                "[partitions.a]\ndefault_time = \"2h\"\nmax_time = \"1h\"\n",
                "over max_time",
            ),
            ("[partitions.\"a b\"]\n", "a name is"),
        ] {
            let c: Config = toml::from_str(text).unwrap();
            let e = c.check_partitions().unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
