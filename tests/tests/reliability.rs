//! Node failure: an agent that goes silent takes its node DOWN; its jobs end NODE_FAIL or
//! are requeued; an agent that returns after that is reconciled, never running a job
//! twice.

use std::time::Duration;

use gpuctl_tests::{Cluster, process_alive, wait_for};
use nix::sys::signal::Signal;

const T: Duration = Duration::from_secs(30);

fn cluster() -> Cluster {
    let mut c = Cluster::controller_with_config("node_timeout = \"2s\"");
    c.add_agent("n1", "2xA100-80GB", &[]);
    c.wait_nodes_up(1);
    c
}

const REQUEUE: &str = "requeue = true\nscript = \"echo $$ > pid-$GPUCTL_JOB_ID-$GPUCTL_NODE; sleep 60\"\n[resources]\ngpus = 1\n";
const PLAIN: &str = "script = \"sleep 60\"\n[resources]\ngpus = 1\n";

#[test]
fn lost_agent_fails_or_requeues_its_jobs() {
    let mut c = cluster();
    let requeued = c.submit("r.toml", REQUEUE);
    let failed = c.submit("p.toml", PLAIN);
    c.wait_state(requeued, "RUNNING", T);
    c.wait_state(failed, "RUNNING", T);
    c.add_agent("n2", "2xA100-80GB", &[]);
    c.wait_nodes_up(2);
    c.kill9_agent("n1");
    let j = c.wait_state(failed, "NODE_FAIL", T);
    assert!(j["reason"].as_str().unwrap().contains("n1"), "{j}");
    // The requeued job runs again, on the node that is left.
    assert!(wait_for(T, || {
        let j = c.job(requeued);
        j["state"] == "RUNNING" && j["node"] == "n2"
    }));
    assert_eq!(c.node_state("n1"), "DOWN");
    c.gpuctl_ok(&["cancel", &requeued.to_string()]);
}

#[test]
fn agent_back_after_being_declared_down_is_reconciled() {
    let mut c = cluster();
    let id = c.submit("r.toml", REQUEUE);
    c.wait_state(id, "RUNNING", T);
    let first = c.path(&format!("pid-{id}-n1"));
    let pid = gpuctl_tests::wait_for_pid(&first, T);
    c.add_agent("n2", "1xA100-80GB", &[]);
    c.wait_nodes_up(2);
    // n1 freezes: no heartbeats. After the timeout its job is requeued onto n2.
    c.signal_agent("n1", Signal::SIGSTOP);
    assert!(wait_for(T, || c.job(id)["node"] == "n2"
        && c.job(id)["state"] == "RUNNING"));
    assert!(
        process_alive(pid),
        "the first copy runs on while n1 is frozen"
    );
    // n1 thaws, re-attaches with the job still running: the controller has it elsewhere,
    // so n1's copy is killed. The job runs once, on n2.
    c.signal_agent("n1", Signal::SIGCONT);
    assert!(
        wait_for(T, || !process_alive(pid)),
        "n1's copy was not killed"
    );
    assert!(wait_for(T, || c.node_state("n1") == "IDLE"));
    let j = c.job(id);
    assert_eq!(j["state"], "RUNNING");
    assert_eq!(j["node"], "n2");
    c.gpuctl_ok(&["cancel", &id.to_string()]);
    c.wait_state(id, "CANCELLED", T);
}

fn attempt_job(c: &Cluster, sleep: u32) -> u64 {
    c.submit(
        "r.toml",
        &format!("requeue = true\nscript = \"echo start-$GPUCTL_JOB_ATTEMPT >> log-$GPUCTL_JOB_ID; sleep {sleep}; echo end-$GPUCTL_JOB_ATTEMPT >> log-$GPUCTL_JOB_ID\"\n[resources]\ngpus = 1\n"),
    )
}

fn log_lines(c: &Cluster, id: u64) -> Vec<String> {
    std::fs::read_to_string(c.path(&format!("log-{id}")))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// One node: its agent freezes, the job is requeued (nowhere else to go), the agent
/// thaws with the start still running: the controller adopts it again rather than
/// running the job a second time.
#[test]
fn requeued_job_still_running_on_returning_node_is_adopted_not_rerun() {
    let c = cluster();
    let id = attempt_job(&c, 6);
    assert_eq!(c.wait_state(id, "RUNNING", T)["attempt"], 1);
    assert!(wait_for(T, || log_lines(&c, id).len() == 1));
    c.signal_agent("n1", Signal::SIGSTOP);
    assert!(wait_for(T, || c.job(id)["state"] == "PENDING"));
    c.signal_agent("n1", Signal::SIGCONT);
    assert!(wait_for(T, || c.job(id)["state"] != "PENDING"));
    let j = c.wait_state(id, "COMPLETED", T);
    assert_eq!(j["attempt"], 1, "{j}");
    assert_eq!(log_lines(&c, id), ["start-1", "end-1"]);
}

/// The same, but the job ends while its agent is frozen: the end the agent reports on
/// return is the job's real end; it does not run again.
#[test]
fn requeued_job_that_ended_meanwhile_gets_its_real_end() {
    let c = cluster();
    let id = attempt_job(&c, 3);
    c.wait_state(id, "RUNNING", T);
    assert!(wait_for(T, || log_lines(&c, id).len() == 1));
    c.signal_agent("n1", Signal::SIGSTOP);
    assert!(wait_for(T, || c.job(id)["state"] == "PENDING"));
    assert!(wait_for(T, || log_lines(&c, id).len() == 2));
    c.signal_agent("n1", Signal::SIGCONT);
    let j = c.wait_state(id, "COMPLETED", T);
    assert_eq!(j["attempt"], 1, "{j}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(log_lines(&c, id), ["start-1", "end-1"]);
}
