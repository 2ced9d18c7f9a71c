//! A randomized fault run on the real binaries (issue 40, Jepsen-style): three
//! controllers on Raft, each in a network namespace of its own, two agents, two long
//! jobs, and three clients submitting whole-GPU jobs and cancelling some, while a seeded
//! schedule kills (`-9`), freezes (SIGSTOP), partitions and restarts controllers, one
//! or two at a time (two: no quorum for a while). A monitor lists every job all along.
//!
//! The checker, once the faults end and the members heal:
//! - every acknowledged submit is queued exactly once (its name names one job);
//! - every job's observed history is legal: no job leaves a final state, a job that
//!   ended had started, attempts never go back, and no job once listed vanishes;
//! - no GPU was ever given to two jobs at once: each job takes its GPU's lock
//!   (`flock -n` on a file per node and GPU) and records a conflict if another holds it;
//! - no job ran twice (its own record and the agents' launches), and every job that ran
//!   is known to have started;
//! - the long jobs ran through it all, and a new job runs at the end.
//!
//! `run` answers what it saw and the violations it found; the test (`tests/faults.rs`)
//! runs a short schedule, the bench (`benches/faults.rs`) a long one.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::replicated::{Clients, Replicated};

/// Every state a listing may show.
const ALL: &str = "PENDING,RUNNING,COMPLETED,FAILED,CANCELLED,TIMEOUT,NODE_FAIL,PREEMPTED";
/// States a job never leaves (no requeue is asked for in this run).
const FINAL: [&str; 4] = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"];

/// What a fault run saw.
#[derive(Debug, Default)]
pub struct Outcome {
    pub seed: u64,
    /// The faults, in order, as `"<at s> <what>"`.
    pub faults: Vec<String>,
    pub acknowledged: usize,
    /// Jobs whose script ran (its own record).
    pub ran: usize,
    /// Listings the monitor read.
    pub listings: usize,
    /// The longest time no listing was served.
    pub longest_gap: Duration,
    pub violations: Vec<String>,
}

/// A small seeded generator (splitmix64): the schedule is the seed's.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

/// The faults the schedule picks from.
#[derive(Debug, Clone, Copy)]
enum Fault {
    KillLeader,
    KillOne,
    /// Two members at once: no quorum until one is back.
    KillTwo,
    Freeze,
    PartitionLeader,
    PartitionOne,
}

const FAULTS: [Fault; 6] = [
    Fault::KillLeader,
    Fault::KillOne,
    Fault::KillTwo,
    Fault::Freeze,
    Fault::PartitionLeader,
    Fault::PartitionOne,
];

/// A whole-GPU job that holds its GPU's lock while it runs and records itself.
fn gpu_job(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"name = "gpu"
script = '''
lock="{d}/gpu-$GPUCTL_NODE-$CUDA_VISIBLE_DEVICES.lock"
exec 9>>"$lock"
if ! flock -n 9; then
  echo "$GPUCTL_JOB_ID $GPUCTL_JOB_ATTEMPT $GPUCTL_NODE $CUDA_VISIBLE_DEVICES" >> "{d}/conflicts"
  exit 3
fi
echo "$GPUCTL_JOB_ID $GPUCTL_JOB_ATTEMPT $GPUCTL_NODE $CUDA_VISIBLE_DEVICES" >> "{d}/ran"
sleep 0.3
'''
[resources]
gpus = 1
"#
    )
}

const LONG: &str = "name = \"long\"\nscript = \"sleep 3600\"\n[resources]\ngpus = 1\n";

/// One job as a listing shows it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    state: String,
    attempt: u64,
    name: String,
    node: String,
}

fn listing(r: &Replicated) -> Option<BTreeMap<u64, Seen>> {
    let v = r.json(&["queue", "-t", ALL])?;
    let jobs = v.as_array()?.iter().map(|j| {
        let text = |k: &str| j[k].as_str().unwrap_or_default().to_string();
        let seen = Seen {
            state: text("state"),
            attempt: j["attempt"].as_u64().unwrap_or_default(),
            name: text("name"),
            node: text("node"),
        };
        (j["id"].as_u64().unwrap_or_default(), seen)
    });
    Some(jobs.collect())
}

/// Every job's observed history: (state, attempt) as it changed.
#[derive(Default)]
struct Histories {
    jobs: BTreeMap<u64, Vec<(String, u64)>>,
    violations: Vec<String>,
    listings: usize,
}

impl Histories {
    fn observe(&mut self, listed: &BTreeMap<u64, Seen>) {
        self.listings += 1;
        for (id, s) in listed {
            let h = self.jobs.entry(*id).or_default();
            let now = (s.state.clone(), s.attempt);
            if h.last() != Some(&now) {
                if let Some(why) = h.last().and_then(|before| illegal(before, &now)) {
                    self.violations
                        .push(format!("job {id}: {why} (history {h:?})"));
                }
                h.push(now);
            }
        }
        for id in self.jobs.keys().filter(|id| !listed.contains_key(id)) {
            self.violations
                .push(format!("job {id} was listed and then vanished"));
        }
    }
}

/// Why going from `before` to `now` (with any states unseen between) is not a legal
/// history in this run, if it is not.
fn illegal(before: &(String, u64), now: &(String, u64)) -> Option<String> {
    let (was, a) = (before.0.as_str(), before.1);
    let (is, b) = (now.0.as_str(), now.1);
    if b < a {
        return Some(format!("attempt went back from {a} to {b}"));
    }
    if FINAL.contains(&was) {
        return Some(format!("left the final state {was} for {is}"));
    }
    if matches!(is, "COMPLETED" | "FAILED" | "TIMEOUT" | "RUNNING") && b == 0 {
        return Some(format!("{is} without ever starting"));
    }
    None
}

/// Runs the cluster through `seconds` of faults drawn from `seed`.
pub fn run(seed: u64, seconds: u64, bins: Option<std::path::PathBuf>) -> Outcome {
    let mut out = Outcome {
        seed,
        ..Outcome::default()
    };
    let partitions = crate::replicated::namespaces_available().is_ok();
    let mut r = match (partitions, bins) {
        (true, bins) => Replicated::start_in_namespaces_with(3, bins).expect("namespaces"),
        (false, Some(bins)) => Replicated::start_with(3, bins, ""),
        (false, None) => Replicated::start(3),
    };
    r.add_agent("a", "4xA100-80GB");
    r.add_agent("b", "4xA100-80GB");
    let dir = r.dir.path().to_path_buf();
    std::fs::write(dir.join("gpu.toml"), gpu_job(&dir)).unwrap();
    std::fs::write(dir.join("long.toml"), LONG).unwrap();
    assert!(
        r.wait_nodes_idle(2, Duration::from_secs(30)),
        "agents did not attach: {}",
        r.agent_log("a")
    );
    let long = start_long(&r, 2);
    let r = Arc::new(r);
    let (stop, histories) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(Mutex::new(Histories::default())),
    );
    let monitor = {
        let (r, stop, histories) = (r.clone(), stop.clone(), histories.clone());
        std::thread::spawn(move || monitor(&r, &stop, &histories))
    };
    let clients = Clients::start_paced(&r, "gpu.toml", Duration::from_millis(150));
    let mut rng = Rng(seed);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        let kinds: Vec<Fault> = (FAULTS.iter().copied())
            .filter(|f| partitions || !matches!(f, Fault::PartitionLeader | Fault::PartitionOne))
            .collect();
        let fault = kinds[rng.below(kinds.len() as u64) as usize];
        let at = started.elapsed().as_secs_f64();
        let what = inject(&r, fault, &mut rng);
        out.faults.push(format!("{at:.1}s {what}"));
        std::thread::sleep(rng.millis(1_000, 3_000));
    }
    // Everything heals; the clients stop once a leader serves them again.
    for id in 1..=3 {
        if partitions {
            r.heal(id);
        }
        if let Some(pid) = r.pid(id) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGCONT,
            );
        } else {
            r.start_member(id);
        }
    }
    assert!(
        r.wait_leader(Duration::from_secs(30)).is_some(),
        "no leader after healing"
    );
    let acked = clients.finish_named();
    out.acknowledged = acked.len();
    // The queue drains (short jobs end), then the last listing.
    let drained = crate::wait_for(Duration::from_secs(60), || {
        listing(&r).is_some_and(|l| {
            (l.values()).all(|s| s.name == "long" || FINAL.contains(&s.state.as_str()))
        })
    });
    stop.store(true, Ordering::SeqCst);
    let longest_gap = monitor.join().expect("the monitor");
    out.longest_gap = longest_gap;
    let last = listing(&r).expect("a listing after healing");
    {
        let mut h = histories.lock().unwrap();
        h.observe(&last);
        out.listings = h.listings;
        out.violations.append(&mut h.violations);
    }
    if !drained {
        let left: Vec<_> = (last.iter())
            .filter(|(_, s)| s.name != "long" && !FINAL.contains(&s.state.as_str()))
            .map(|(id, s)| format!("{id} {}", s.state))
            .collect();
        out.violations
            .push(format!("the queue did not drain within 60 s: {left:?}"));
    }
    check(&r, &dir, &acked, &last, &long, &mut out);
    if !out.violations.is_empty() {
        // The daemons' logs outlive a run that found something (printed at drop).
        r.keep.store(true, Ordering::SeqCst);
    }
    out
}

/// Starts `n` long jobs; their ids with (attempt, node).
fn start_long(r: &Replicated, n: usize) -> BTreeMap<u64, (u64, String)> {
    for _ in 0..n {
        let done = r.gpuctl(&["submit", "long.toml"]);
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
    }
    let mut running = BTreeMap::new();
    let all = crate::wait_for(Duration::from_secs(20), || {
        running = (listing(r).unwrap_or_default().into_iter())
            .filter(|(_, s)| s.state == "RUNNING")
            .map(|(id, s)| (id, (s.attempt, s.node)))
            .collect();
        running.len() == n
    });
    assert!(all, "the long jobs did not start: {running:?}");
    running
}

/// Lists the jobs every 250 ms until `stop`; the longest time without a listing.
fn monitor(r: &Replicated, stop: &AtomicBool, histories: &Mutex<Histories>) -> Duration {
    let (mut last, mut longest) = (Instant::now(), Duration::ZERO);
    while !stop.load(Ordering::SeqCst) {
        if let Some(l) = listing(r) {
            longest = longest.max(last.elapsed());
            last = Instant::now();
            histories.lock().unwrap().observe(&l);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    longest
}

/// Injects one fault and undoes it after a while (a kill: the member restarts from its
/// disk); what it did.
fn inject(r: &Replicated, fault: Fault, rng: &mut Rng) -> String {
    let leader = r.wait_leader(Duration::from_secs(10));
    let member = |rng: &mut Rng| 1 + rng.below(3);
    let other = |rng: &mut Rng, not: u64| (not + rng.below(2)) % 3 + 1;
    let hold = rng.millis(300, 3_000);
    match fault {
        Fault::KillLeader | Fault::KillOne | Fault::KillTwo => {
            let first = match (fault, leader) {
                (Fault::KillLeader, Some(l)) => l,
                _ => member(rng),
            };
            let mut ids = vec![first];
            if matches!(fault, Fault::KillTwo) {
                ids.push(other(rng, first));
            }
            ids.iter().for_each(|id| r.kill9(*id));
            std::thread::sleep(hold);
            ids.iter().for_each(|id| r.start_member(*id));
            format!("kill -9 {ids:?} (leader {leader:?}), restarted after {hold:?}")
        }
        Fault::Freeze => {
            let id = member(rng);
            let pid = nix::unistd::Pid::from_raw(r.pid(id).expect("running"));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP);
            std::thread::sleep(hold);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
            format!("SIGSTOP {id} (leader {leader:?}) for {hold:?}")
        }
        Fault::PartitionLeader | Fault::PartitionOne => {
            let id = match (fault, leader) {
                (Fault::PartitionLeader, Some(l)) => l,
                _ => member(rng),
            };
            r.partition(id);
            std::thread::sleep(hold);
            r.heal(id);
            format!("partition {id} (leader {leader:?}) for {hold:?}")
        }
    }
}

/// The checks after healing (see the module's doc).
fn check(
    r: &Replicated,
    dir: &Path,
    acked: &[(u64, String)],
    last: &BTreeMap<u64, Seen>,
    long: &BTreeMap<u64, (u64, String)>,
    out: &mut Outcome,
) {
    let v = &mut out.violations;
    let mut by_name: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (id, s) in last {
        by_name.entry(s.name.as_str()).or_default().push(*id);
    }
    for (id, name) in acked {
        match by_name.get(name.as_str()).map(Vec::as_slice) {
            Some([one]) if one == id => {}
            None | Some([]) => v.push(format!("acknowledged job {id} ({name}) lost")),
            Some(ids) => v.push(format!(
                "submit {name} (acknowledged as {id}) queued as {ids:?}"
            )),
        }
    }
    for (name, ids) in &by_name {
        if *name != "long" && ids.len() > 1 {
            v.push(format!("submit {name} queued {} times: {ids:?}", ids.len()));
        }
    }
    let conflicts = std::fs::read_to_string(dir.join("conflicts")).unwrap_or_default();
    for line in conflicts.lines() {
        v.push(format!("a GPU given to two jobs at once: {line}"));
    }
    let ran = std::fs::read_to_string(dir.join("ran")).unwrap_or_default();
    let mut runs: BTreeMap<u64, usize> = BTreeMap::new();
    for id in ran
        .lines()
        .filter_map(|l| l.split(' ').next()?.parse().ok())
    {
        *runs.entry(id).or_default() += 1;
    }
    out.ran = runs.len();
    for (id, n) in &runs {
        if *n > 1 {
            v.push(format!("job {id} ran {n} times"));
        }
        match last.get(id) {
            None => v.push(format!("job {id} ran but is not listed")),
            Some(s) if s.attempt == 0 => v.push(format!("job {id} ran but never started: {s:?}")),
            Some(_) => {}
        }
    }
    for (id, n) in r.launches() {
        if n > 1 {
            v.push(format!("job {id} launched {n} times by the agents"));
        }
    }
    for (id, (attempt, node)) in long {
        match last.get(id) {
            Some(s) if s.state == "RUNNING" && s.attempt == *attempt && s.node == *node => {}
            other => v.push(format!("long job {id} was disturbed: {other:?}")),
        }
    }
    let failed: Vec<_> = (last.iter())
        .filter(|(_, s)| matches!(s.state.as_str(), "FAILED" | "NODE_FAIL" | "TIMEOUT"))
        .map(|(id, s)| format!("{id} {}", s.state))
        .collect();
    if !failed.is_empty() {
        v.push(format!("jobs failed under the faults: {failed:?}"));
    }
    // Still live: a job submitted now runs.
    let fresh = r.gpuctl(&["submit", "gpu.toml", "-J", "after", "--json"]);
    let id = serde_json::from_slice::<serde_json::Value>(&fresh.stdout)
        .ok()
        .and_then(|j| j["job_id"].as_u64());
    let ran_after = id.is_some_and(|id| {
        crate::wait_for(Duration::from_secs(30), || {
            listing(r).is_some_and(|l| l.get(&id).is_some_and(|s| s.state == "COMPLETED"))
        })
    });
    if !ran_after {
        v.push(format!(
            "a job submitted after the faults did not run: {}",
            String::from_utf8_lossy(&fresh.stderr)
        ));
    }
}
