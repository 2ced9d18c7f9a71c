//! GPU monitoring on the node: samples every GPU, maps GPU processes to the jobs that
//! own them (by cgroup: a child that leaves the job's session or process group with
//! `setsid` or a double fork stays in its cgroup; by process group only for a job that
//! has no cgroup on this host), enforces GPU-memory shares,
//! and keeps the latest metrics for heartbeats and for the Prometheus endpoint (DCGM
//! exporter names, so existing Grafana dashboards work).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpuctl_proto as pb;

use crate::gpu::{GpuInfo, GpuSample};

/// What the monitor needs to know of a running job.
#[derive(Debug, Clone)]
pub struct Watched {
    pub job_id: u64,
    pub attempt: u32,
    /// The job's process group (its leader's pid).
    pub pgid: i32,
    /// What it holds: GPU or MIG UUIDs and, for shares, the memory it may use.
    pub slots: Vec<pb::SlotUse>,
    /// Who submitted it (a metric label).
    pub user: String,
    /// Its cgroup (CPU time and peak memory for heartbeats).
    pub cgroup: Option<crate::cgroup::JobCgroup>,
}

/// A job using more GPU memory than its share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overuse {
    pub job_id: u64,
    pub gpu: String,
    pub used_mib: u64,
    pub share_mib: u64,
}

/// What one sample decided for enforcement.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdicts {
    /// Just went over: warn.
    pub warn: Vec<Overuse>,
    /// Over for longer than the grace: end the job.
    pub kill: Vec<Overuse>,
}

/// Which job a process belongs to.
pub struct Owners {
    /// `/<job cgroup name>` and the job: a process whose cgroup path (in any
    /// hierarchy, below whatever root the agent's cgroups live under) ends with it or
    /// goes on below it is the job's.
    by_cgroup: Vec<(String, u64)>,
    /// Jobs without a cgroup (a host where none is writable): by process group.
    by_pgid: HashMap<i32, u64>,
}

impl Owners {
    pub fn new(jobs: &[Watched]) -> Owners {
        let mut by_cgroup = Vec::new();
        let mut by_pgid = HashMap::new();
        for w in jobs {
            match &w.cgroup {
                Some(cg) => by_cgroup.push((format!("/{}", cg.name.trim_matches('/')), w.job_id)),
                None => {
                    by_pgid.insert(w.pgid, w.job_id);
                }
            }
        }
        Owners { by_cgroup, by_pgid }
    }

    /// The job of a process in `cgroups` (its /proc/PID/cgroup paths) and process
    /// group `pgid`.
    pub fn of(&self, cgroups: &[String], pgid: Option<i32>) -> Option<u64> {
        let in_cgroup = cgroups.iter().find_map(|path| {
            self.by_cgroup.iter().find_map(|(name, job)| {
                let at = path.find(name.as_str())?;
                let rest = &path[at + name.len()..];
                (rest.is_empty() || rest.starts_with('/')).then_some(*job)
            })
        });
        in_cgroup.or_else(|| pgid.and_then(|g| self.by_pgid.get(&g).copied()))
    }

    /// The job of a live process, from /proc.
    pub fn of_pid(&self, pid: u32) -> Option<u64> {
        let cgroups = if self.by_cgroup.is_empty() {
            Vec::new()
        } else {
            crate::procfs::cgroups_of(pid)
        };
        let pgid = if self.by_pgid.is_empty() {
            None
        } else {
            crate::procfs::pgid_of(pid)
        };
        self.of(&cgroups, pgid)
    }
}

/// Per GPU (by UUID), memory and processes per job id, from the sample's processes
/// (`owner` says which job a pid is, if any).
pub fn job_memory(
    samples: &[GpuSample],
    owner: impl Fn(u32) -> Option<u64>,
) -> HashMap<String, BTreeMap<u64, (u64, u32)>> {
    let mut out: HashMap<String, BTreeMap<u64, (u64, u32)>> = HashMap::new();
    for s in samples {
        let per = out.entry(s.uuid.clone()).or_default();
        for p in &s.processes {
            if let Some(job) = owner(p.pid) {
                let e = per.entry(job).or_default();
                e.0 += p.mem_used_mib;
                e.1 += 1;
            }
        }
    }
    out
}

/// Per GPU (by UUID), each job's share of its time (percent, at most 100) where the
/// driver samples every one of its processes there (`owner` as for `job_memory`).
pub fn job_busy(
    samples: &[GpuSample],
    owner: impl Fn(u32) -> Option<u64>,
) -> HashMap<String, BTreeMap<u64, u32>> {
    let mut out: HashMap<String, BTreeMap<u64, u32>> = HashMap::new();
    for s in samples {
        let mut per: BTreeMap<u64, Option<u32>> = BTreeMap::new();
        for p in &s.processes {
            if let Some(job) = owner(p.pid) {
                let e = per.entry(job).or_insert(Some(0));
                *e = e.zip(p.util_pct).map(|(a, b)| (a + b).min(100));
            }
        }
        let known: BTreeMap<u64, u32> =
            per.into_iter().filter_map(|(j, b)| Some((j, b?))).collect();
        if !known.is_empty() {
            out.insert(s.uuid.clone(), known);
        }
    }
    out
}

/// Tracks how long each job has been over its share. Pure apart from the `now` given.
#[derive(Default)]
pub struct Enforcer {
    over_since: HashMap<(u64, String), Instant>,
}

impl Enforcer {
    /// `gpus` maps MIG UUIDs to their parent GPU (processes are seen on the parent).
    pub fn check(
        &mut self,
        gpus: &[GpuInfo],
        jobs: &[Watched],
        usage: &HashMap<String, BTreeMap<u64, (u64, u32)>>,
        grace: Duration,
        now: Instant,
    ) -> Verdicts {
        let parent: HashMap<&str, &str> = gpus
            .iter()
            .flat_map(|g| {
                std::iter::once((g.uuid.as_str(), g.uuid.as_str()))
                    .chain(g.mig.iter().map(|m| (m.uuid.as_str(), g.uuid.as_str())))
            })
            .collect();
        let mut v = Verdicts::default();
        let mut still_over = Vec::new();
        for w in jobs {
            for slot in w.slots.iter().filter(|s| s.memory_mib > 0) {
                let gpu = parent
                    .get(slot.uuid.as_str())
                    .copied()
                    .unwrap_or(&slot.uuid);
                let used = usage
                    .get(gpu)
                    .and_then(|m| m.get(&w.job_id))
                    .map_or(0, |x| x.0);
                if used <= slot.memory_mib {
                    continue;
                }
                let key = (w.job_id, gpu.to_string());
                let o = Overuse {
                    job_id: w.job_id,
                    gpu: gpu.to_string(),
                    used_mib: used,
                    share_mib: slot.memory_mib,
                };
                match self.over_since.get(&key) {
                    None => {
                        self.over_since.insert(key.clone(), now);
                        v.warn.push(o);
                    }
                    Some(since) if now.duration_since(*since) >= grace => v.kill.push(o),
                    Some(_) => {}
                }
                still_over.push(key);
            }
        }
        // Back under (or gone): forget.
        self.over_since.retain(|k, _| still_over.contains(k));
        v
    }
}

/// The latest sample, as heartbeats carry it.
pub fn to_pb(
    samples: &[GpuSample],
    usage: &HashMap<String, BTreeMap<u64, (u64, u32)>>,
    busy: &HashMap<String, BTreeMap<u64, u32>>,
    time_ms: i64,
) -> Vec<pb::GpuMetrics> {
    samples
        .iter()
        .map(|s| pb::GpuMetrics {
            uuid: s.uuid.clone(),
            util_pct: s.util_pct,
            mem_util_pct: s.mem_util_pct,
            mem_used_mib: s.mem_used_mib,
            temp_c: s.temp_c,
            fan_pct: s.fan_pct,
            power_w: s.power_w,
            power_limit_w: s.power_limit_w,
            ecc_uncorrected: s.ecc_uncorrected,
            last_xid: s.xid.map(|x| x.0),
            last_xid_ms: s.xid.map_or(0, |x| x.1),
            row_remap_failure: s.remapped_rows.is_some_and(|r| r.failed),
            jobs: usage
                .get(&s.uuid)
                .into_iter()
                .flatten()
                .map(|(job, (mib, n))| pb::JobGpuUse {
                    job_id: *job,
                    mem_used_mib: *mib,
                    processes: *n,
                    util_pct: busy.get(&s.uuid).and_then(|b| b.get(job)).copied(),
                })
                .collect(),
            time_ms,
        })
        .collect()
}

/// Latest metrics shared between the sampler, heartbeats and the HTTP endpoint.
#[derive(Default)]
pub struct Latest {
    pub metrics: Mutex<Vec<pb::GpuMetrics>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ProcessUse;

    fn sample(uuid: &str, procs: &[(u32, u64)]) -> GpuSample {
        GpuSample {
            uuid: uuid.into(),
            processes: procs
                .iter()
                .map(|&(pid, mem_used_mib)| ProcessUse {
                    pid,
                    mem_used_mib,
                    util_pct: None,
                })
                .collect(),
            ..GpuSample::default()
        }
    }

    fn watched(job: u64, pgid: i32, share_mib: u64) -> Watched {
        Watched {
            cgroup: None,
            user: String::new(),
            job_id: job,
            attempt: 1,
            pgid,
            slots: vec![pb::SlotUse {
                uuid: "GPU-a".into(),
                compute_milli: 250,
                memory_mib: share_mib,
            }],
        }
    }

    #[test]
    fn processes_map_to_jobs_by_process_group_where_a_job_has_no_cgroup() {
        let s = [sample(
            "GPU-a",
            &[(100, 1000), (101, 500), (200, 300), (300, 7)],
        )];
        let jobs = [watched(1, 100, 2000), watched(2, 200, 2000)];
        let owners = Owners::new(&jobs);
        let pg = |pid: u32| match pid {
            100 | 101 => Some(100),
            200 => Some(200),
            _ => Some(999),
        };
        let u = job_memory(&s, |pid| owners.of(&[], pg(pid)));
        assert_eq!(u["GPU-a"][&1], (1500, 2));
        assert_eq!(u["GPU-a"][&2], (300, 1));
        assert_eq!(u["GPU-a"].len(), 2, "a process of no job counts for none");
    }

    /// A job's child that left its session (`setsid`) or was double-forked has a
    /// process group of its own but stays in the job's cgroup: it is the job's.
    #[test]
    fn processes_map_to_jobs_by_cgroup_whatever_their_process_group() {
        let mut a = watched(1, 100, 2000);
        a.cgroup = Some(crate::cgroup::JobCgroup::named_for_tests(
            "gpuctl/n1-x/job-1",
        ));
        let mut b = watched(11, 200, 2000);
        b.cgroup = Some(crate::cgroup::JobCgroup::named_for_tests(
            "gpuctl/n1-x/job-11",
        ));
        let owners = Owners::new(&[a, b]);
        let cg = |paths: &[&str]| paths.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        // The leader, and a setsid child in a group no job leads.
        assert_eq!(
            owners.of(&cg(&["0::/gpuctl/n1-x/job-1"]), Some(100)),
            Some(1)
        );
        assert_eq!(
            owners.of(&cg(&["0::/gpuctl/n1-x/job-1"]), Some(4242)),
            Some(1)
        );
        // v1 hierarchies, a sub-cgroup, and the agent's cgroups below a delegated root.
        assert_eq!(
            owners.of(&cg(&["/gpuctl/n1-x/job-1/step-0"]), None),
            Some(1)
        );
        assert_eq!(
            owners.of(
                &cg(&["/system.slice/gpud.service/gpuctl/n1-x/job-11"]),
                None
            ),
            Some(11)
        );
        // job-1 is not a prefix of job-11, and a process outside every job is no one's,
        // even in a process group a job led (the group's number was reused).
        assert_eq!(owners.of(&cg(&["/gpuctl/n1-x/job-1x"]), None), None);
        assert_eq!(owners.of(&cg(&["/user.slice"]), Some(100)), None);
    }

    #[test]
    fn over_share_warns_then_kills_after_grace_and_forgets_when_back_under() {
        let gpus = [GpuInfo::a100_for_tests("GPU-a")];
        let jobs = [watched(1, 100, 1000)];
        let mut e = Enforcer::default();
        let t0 = Instant::now();
        let grace = Duration::from_secs(10);
        let over: HashMap<String, BTreeMap<u64, (u64, u32)>> =
            [("GPU-a".to_string(), BTreeMap::from([(1, (1500, 1))]))].into();
        let under: HashMap<String, BTreeMap<u64, (u64, u32)>> =
            [("GPU-a".to_string(), BTreeMap::from([(1, (900, 1))]))].into();
        let v = e.check(&gpus, &jobs, &over, grace, t0);
        assert_eq!(v.warn.len(), 1);
        assert_eq!(v.warn[0].used_mib, 1500);
        assert!(v.kill.is_empty());
        let v = e.check(&gpus, &jobs, &over, grace, t0 + Duration::from_secs(5));
        assert_eq!(v, Verdicts::default());
        // Back under resets the clock.
        e.check(&gpus, &jobs, &under, grace, t0 + Duration::from_secs(6));
        let v = e.check(&gpus, &jobs, &over, grace, t0 + Duration::from_secs(11));
        assert_eq!(v.warn.len(), 1, "a new episode warns again");
        let v = e.check(&gpus, &jobs, &over, grace, t0 + Duration::from_secs(21));
        assert_eq!(v.kill.len(), 1);
        assert_eq!(v.kill[0].share_mib, 1000);
    }
}
