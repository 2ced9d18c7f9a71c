//! The agent's command handling and job lifecycle, driven in process with a launcher
//! double: signed commands go in, launches and job reports come out. No controller,
//! no cgroups, no user switch; the processes the double starts are real.

use std::sync::atomic::Ordering;

use super::*;
use crate::launch::{LaunchSpec, Launched};

/// Records every launch and starts a real `sh -c SCRIPT` (or fails, if told to).
#[derive(Default)]
struct FakeLauncher {
    launched: Mutex<Vec<LaunchSpec>>,
    script: String,
    fail: Option<String>,
}

impl Launcher for FakeLauncher {
    fn spawn(&self, spec: &LaunchSpec) -> std::io::Result<Launched> {
        self.launched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(spec.clone());
        if let Some(why) = &self.fail {
            return Err(std::io::Error::other(why.clone()));
        }
        let child = tokio::process::Command::new("/bin/sh")
            .args(["-c", &self.script])
            .process_group(0)
            .spawn()?;
        Ok(Launched::started(child))
    }
}

struct Harness {
    agent: Arc<Agent>,
    launcher: Arc<FakeLauncher>,
    session: Session,
    key: ClusterKey,
    _dir: tempfile::TempDir,
}

/// Shares one `FakeLauncher` between the agent and the test.
struct Shared(Arc<FakeLauncher>);

impl Launcher for Shared {
    fn spawn(&self, spec: &LaunchSpec) -> std::io::Result<Launched> {
        self.0.spawn(spec)
    }
}

fn harness(launcher: FakeLauncher) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::generate();
    let backend = crate::gpu::FakeGpus::parse("2xA100-80GB", "n1").unwrap();
    let gpus = backend.discover().unwrap();
    let opts = Options {
        controller: "http://127.0.0.1:1".into(),
        name: "n1".into(),
        state_dir: dir.path().to_path_buf(),
        backend: Arc::new(backend),
        cpus: 4,
        memory_bytes: 1 << 30,
        heartbeat: Duration::from_secs(1),
        allow_root_jobs: true,
        cgroup_base: dir.path().join("no-cgroups"),
        cgroup_favordynmods: false,
        cgroup_parent: None,
        key: key.clone(),
        tls: None,
        sample_interval: Duration::from_secs(1),
        gpu_memory_grace: Duration::from_secs(1),
        metrics_listen: None,
        health: None,
        mps_control: None,
        inventory_interval: Duration::from_secs(60),
        address: None,
        features: Vec::new(),
        mig_dynamic: false,
    };
    let launcher = Arc::new(launcher);
    let mps = crate::mps::Mps::find(None, &dir.path().join("mps"));
    let agent = Agent::new(
        &opts,
        Box::new(Shared(launcher.clone())),
        mps,
        "test-agent".into(),
        gpus,
    )
    .unwrap();
    let session = Session {
        id: b"session-1".to_vec(),
        seq: Default::default(),
        last_cmd: Default::default(),
        handled: Default::default(),
        confirmed: Mutex::new(std::time::Instant::now()),
        node_timeout: Duration::from_secs(30),
    };
    Harness {
        agent: Arc::new(agent),
        launcher,
        session,
        key,
        _dir: dir,
    }
}

impl Harness {
    fn command(&self, seq: u64, command: pb::agent_command::Command) -> pb::SignedCommand {
        self.key.sign_command("n1", &self.unsigned(seq, command))
    }

    fn unsigned(&self, seq: u64, command: pb::agent_command::Command) -> pb::AgentCommand {
        pb::AgentCommand {
            command: Some(command),
            session: self.session.id.clone(),
            seq,
            term: 0,
        }
    }

    fn start(&self, seq: u64, job: u64, attempt: u32) -> pb::SignedCommand {
        self.command(seq, self.start_job(job, attempt))
    }

    fn start_job(&self, job: u64, attempt: u32) -> pb::agent_command::Command {
        let uuid = self.agent.gpus.lock().unwrap()[1].uuid.clone();
        pb::agent_command::Command::Start(pb::StartJob {
            job_id: job,
            attempt,
            spec: Some(pb::JobSpec {
                user: "root".into(),
                name: "t".into(),
                command: vec!["/bin/true".into()],
                workdir: self._dir.path().display().to_string(),
                ..pb::JobSpec::default()
            }),
            slots: vec![pb::SlotUse {
                uuid,
                compute_milli: 1000,
                memory_mib: 0,
            }],
            time_limit_secs: 60,
            kill_grace_secs: 1,
            nodelist: vec!["n1".into()],
            ..pb::StartJob::default()
        })
    }

    fn launches(&self) -> Vec<LaunchSpec> {
        self.launcher.launched.lock().unwrap().clone()
    }

    /// Waits (at most 10 s) until the reports include an end of `job`, and returns them.
    async fn until_ended(&self, job: u64) -> Vec<pb::JobReport> {
        for _ in 0..200 {
            let r = self.agent.reports.snapshot();
            if r.iter()
                .any(|r| r.job_id == job && r.kind() == pb::job_report::Kind::Ended)
            {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("job {job} did not end: {:?}", self.agent.reports.snapshot());
    }
}

fn kinds(reports: &[pb::JobReport], job: u64) -> Vec<(pb::job_report::Kind, JobState)> {
    reports
        .iter()
        .filter(|r| r.job_id == job)
        .map(|r| (r.kind(), r.state()))
        .collect()
}

#[tokio::test]
async fn a_start_launches_on_its_gpus_and_reports_start_and_end() {
    let h = harness(FakeLauncher {
        script: "exit 0".into(),
        ..FakeLauncher::default()
    });
    handle(&h.agent, &h.session, h.start(1, 7, 1));
    let reports = h.until_ended(7).await;
    let launched = h.launches();
    assert_eq!(launched.len(), 1);
    let spec = &launched[0];
    let gpu = h.agent.gpus.lock().unwrap()[1].uuid.clone();
    assert_eq!((spec.job_id, spec.attempt), (7, 1));
    assert_eq!(spec.env["CUDA_VISIBLE_DEVICES"], gpu);
    assert_eq!(spec.env["SLURM_JOB_ID"], "7");
    assert!(
        spec.status_file.is_some(),
        "the agent always starts jobs under a shim that records their status"
    );
    assert_eq!(
        kinds(&reports, 7),
        vec![
            (pb::job_report::Kind::Started, JobState::Unspecified),
            (pb::job_report::Kind::Ended, JobState::Completed),
        ]
    );
    assert_eq!(h.session.handled.load(Ordering::SeqCst), 1);
    // The instance is gone from the running set once it ended.
    for _ in 0..100 {
        if h.agent.running().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("job still listed as running: {:?}", h.agent.running());
}

#[tokio::test]
async fn replays_other_sessions_and_forgeries_launch_nothing() {
    let h = harness(FakeLauncher {
        script: "sleep 30".into(),
        ..FakeLauncher::default()
    });
    let first = h.start(1, 1, 1);
    handle(&h.agent, &h.session, first.clone());
    // The same bytes again (a replay), and a new number for the same instance.
    handle(&h.agent, &h.session, first);
    handle(&h.agent, &h.session, h.start(2, 1, 1));
    // A command of another session.
    let other = pb::AgentCommand {
        session: b"session-0".to_vec(),
        ..h.unsigned(3, h.start_job(2, 1))
    };
    handle(&h.agent, &h.session, h.key.sign_command("n1", &other));
    // Signed with another key.
    let forged = ClusterKey::generate().sign_command("n1", &h.unsigned(4, h.start_job(3, 1)));
    handle(&h.agent, &h.session, forged);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let launched: Vec<_> = h.launches().iter().map(|s| s.job_id).collect();
    assert_eq!(launched, vec![1], "one launch: the first start only");
    assert_eq!(h.agent.running().len(), 1);
    assert!(
        h.agent
            .kill(1, 0, JobState::Cancelled, Duration::ZERO, "test over")
    );
    h.until_ended(1).await;
}

#[tokio::test]
async fn commands_of_a_deposed_leader_launch_nothing() {
    let h = harness(FakeLauncher {
        script: "sleep 30".into(),
        ..FakeLauncher::default()
    });
    // A controller answered a challenge in term 5: that is the newest leader seen.
    let answer = pb::ChallengeResponse {
        term: 5,
        ..Default::default()
    };
    assert!(h.agent.check_term(answer).is_ok());
    // An older term's controller is refused as a controller to attach to...
    let older = pb::ChallengeResponse {
        term: 4,
        ..Default::default()
    };
    let refused = h.agent.check_term(older).unwrap_err();
    assert!(refused.message().contains("deposed"), "{refused:?}");
    // ... and a command of term 4 (a deposed leader's, signed and numbered alright)
    // is dropped; term 5's runs.
    let stale = pb::AgentCommand {
        term: 4,
        ..h.unsigned(1, h.start_job(1, 1))
    };
    handle(&h.agent, &h.session, h.key.sign_command("n1", &stale));
    let current = pb::AgentCommand {
        term: 5,
        ..h.unsigned(2, h.start_job(2, 1))
    };
    handle(&h.agent, &h.session, h.key.sign_command("n1", &current));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let launched: Vec<_> = h.launches().iter().map(|s| s.job_id).collect();
    assert_eq!(launched, vec![2], "only the current term's start");
    assert!(
        h.agent
            .kill(2, 0, JobState::Cancelled, Duration::ZERO, "test over")
    );
    h.until_ended(2).await;
}

#[tokio::test]
async fn a_kill_ends_the_job_with_the_state_and_reason_asked() {
    let h = harness(FakeLauncher {
        script: "sleep 30".into(),
        ..FakeLauncher::default()
    });
    handle(&h.agent, &h.session, h.start(1, 5, 2));
    for _ in 0..100 {
        if h.agent.reports.snapshot().iter().any(|r| r.job_id == 5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kill = pb::agent_command::Command::Kill(pb::KillJob {
        job_id: 5,
        attempt: 2,
        reason: "cancelled by alice".into(),
        kill_grace_secs: 1,
        as_state: JobState::Cancelled as i32,
        signal: String::new(),
        signal_only: false,
    });
    handle(&h.agent, &h.session, h.command(2, kill));
    let reports = h.until_ended(5).await;
    let end = reports
        .iter()
        .find(|r| r.job_id == 5 && r.kind() == pb::job_report::Kind::Ended)
        .unwrap();
    assert_eq!(end.state(), JobState::Cancelled);
    assert_eq!(end.reason, "cancelled by alice");
    assert_eq!(end.attempt, 2);
}

/// A cancel's kills for one node in one command: each job ends as its own kill asks.
#[tokio::test]
async fn kills_in_one_command_end_each_job_as_asked() {
    let h = harness(FakeLauncher {
        script: "sleep 30".into(),
        ..FakeLauncher::default()
    });
    handle(&h.agent, &h.session, h.start(1, 5, 1));
    handle(&h.agent, &h.session, h.start(2, 6, 3));
    for _ in 0..100 {
        let started = h.agent.reports.snapshot();
        if [5, 6]
            .iter()
            .all(|id| started.iter().any(|r| r.job_id == *id))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kill = |job_id, attempt, reason: &str| pb::KillJob {
        job_id,
        attempt,
        reason: reason.into(),
        kill_grace_secs: 1,
        as_state: JobState::Cancelled as i32,
        ..Default::default()
    };
    let kills = pb::agent_command::Command::Kills(pb::KillJobs {
        kills: vec![
            kill(5, 1, "cancelled by alice"),
            kill(6, 3, "cancelled by bob"),
        ],
    });
    handle(&h.agent, &h.session, h.command(3, kills));
    for (id, attempt, reason) in [(5, 1, "cancelled by alice"), (6, 3, "cancelled by bob")] {
        let reports = h.until_ended(id).await;
        let end = (reports.iter())
            .find(|r| r.job_id == id && r.kind() == pb::job_report::Kind::Ended)
            .unwrap();
        assert_eq!(end.state(), JobState::Cancelled);
        assert_eq!((end.attempt, end.reason.as_str()), (attempt, reason));
    }
}

/// `scancel -s USR1`: the job's processes hear the signal and the job runs on; no KILL
/// follows, and a kill afterwards still ends it as asked.
#[tokio::test]
async fn a_signal_only_command_is_heard_and_the_job_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let heard = dir.path().join("heard");
    let h = harness(FakeLauncher {
        script: format!(
            "trap 'echo usr1 >> {}' USR1; while :; do sleep 0.05; done",
            heard.display()
        ),
        ..FakeLauncher::default()
    });
    handle(&h.agent, &h.session, h.start(1, 7, 1));
    // The trap is set once the shell runs (its STARTED report is the launch).
    for _ in 0..100 {
        if h.agent.reports.snapshot().iter().any(|r| r.job_id == 7) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let signal = |seq: u64| {
        let kill = pb::agent_command::Command::Kill(pb::KillJob {
            job_id: 7,
            attempt: 1,
            reason: "SIGUSR1 sent by alice".into(),
            as_state: JobState::Running as i32,
            signal: "USR1".into(),
            signal_only: true,
            ..Default::default()
        });
        handle(&h.agent, &h.session, h.command(seq, kill));
    };
    // One at a time: a second USR1 that arrives while the first is pending merges
    // with it (signals are not queued).
    let heard_n = |n: usize| {
        let heard = heard.clone();
        async move {
            for _ in 0..250 {
                if std::fs::read_to_string(&heard).map_or(0, |s| s.lines().count()) >= n {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    signal(2);
    heard_n(1).await;
    signal(3);
    heard_n(2).await;
    assert_eq!(std::fs::read_to_string(&heard).unwrap(), "usr1\nusr1\n");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ended = h.agent.reports.snapshot();
    assert!(
        !ended
            .iter()
            .any(|r| r.job_id == 7 && r.kind() == pb::job_report::Kind::Ended),
        "the job runs on after its signals: {ended:?}"
    );
    assert!(
        h.agent
            .kill(7, 0, JobState::Cancelled, Duration::ZERO, "test over")
    );
    let reports = h.until_ended(7).await;
    let end = (reports.iter())
        .find(|r| r.kind() == pb::job_report::Kind::Ended)
        .unwrap();
    assert_eq!(end.state(), JobState::Cancelled);
}

#[tokio::test]
async fn a_failed_launch_is_reported_failed_with_its_reason() {
    let h = harness(FakeLauncher {
        fail: Some("cannot enter workdir /x as alice: Permission denied".into()),
        ..FakeLauncher::default()
    });
    handle(&h.agent, &h.session, h.start(1, 9, 1));
    let reports = h.until_ended(9).await;
    assert_eq!(
        kinds(&reports, 9),
        vec![(pb::job_report::Kind::Ended, JobState::Failed)],
        "no STARTED for a job that never ran"
    );
    let end = &reports[0];
    assert!(
        end.reason
            .starts_with("launch failed: cannot enter workdir /x as alice"),
        "{}",
        end.reason
    );
}

#[tokio::test]
async fn a_start_read_after_the_node_timeout_is_not_run() {
    let mut h = harness(FakeLauncher {
        script: "exit 0".into(),
        ..FakeLauncher::default()
    });
    h.session.node_timeout = Duration::from_millis(50);
    tokio::time::sleep(Duration::from_millis(100)).await;
    handle(&h.agent, &h.session, h.start(1, 4, 1));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(h.launches().is_empty());
    assert!(h.agent.reports.snapshot().is_empty());
    // Still counted as handled: the controller learns from the heartbeat that it did
    // not run.
    assert_eq!(h.session.handled.load(Ordering::SeqCst), 1);
}
