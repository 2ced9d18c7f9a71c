//! Interactive allocations (`gpuctl alloc`, like salloc) and steps started from outside
//! a job (`gpuctl run` with a job id): who may, where a step runs, and how an
//! allocation ends when its owner is done with it.

use crate::record::{Job, JobState, state_name};

use crate::error::{Actor, Refusal};
use crate::state::{Cluster, Effects, live_allocs};

/// Where a step goes: the job's nodes, in rank order, and the job's attempt there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepTarget {
    pub nodes: Vec<String>,
    pub attempt: u32,
}

/// Whether `spec` is an allocation (it runs no program of its own).
pub fn is_allocation(j: &Job) -> bool {
    j.spec.interactive
}

impl Cluster {
    /// Where a step of job `id` opened from outside it goes: every node of the job, by
    /// rank (the step's own srun on each runs tasks on the first `nodes`, 0: all, of
    /// them). The job must be running and started, and its owner's (or the caller an
    /// admin), with its nodes connected.
    pub fn step_target(&self, actor: &Actor, id: u64, nodes: u32) -> Result<StepTarget, Refusal> {
        let j = self.own_job(actor, id, "run a step in")?;
        if j.state != JobState::Running {
            return Err(Refusal::failed_precondition(format!(
                "job {id} is {}; steps run in running jobs only",
                state_name(j.state)
            )));
        }
        if self.jobs.get(id).is_some_and(|s| s.cancel_requested) {
            return Err(Refusal::failed_precondition(format!(
                "job {id} is ending (cancelled or released); no new steps start in it"
            )));
        }
        if !self.jobs.get(id).is_some_and(|s| s.start_confirmed) {
            return Err(Refusal::failed_precondition(format!(
                "job {id} is starting: its node has not said it runs yet; try again in a moment"
            )));
        }
        let mut ranks: Vec<(u32, &str)> =
            live_allocs(j).map(|a| (a.rank, a.node.as_str())).collect();
        ranks.sort_unstable();
        let have = ranks.len() as u32;
        if have == 0 {
            return Err(Refusal::failed_precondition(format!(
                "job {id} runs on no node now"
            )));
        }
        let want = if nodes == 0 { have } else { nodes };
        if want > have {
            return Err(Refusal::invalid_argument(format!(
                "-N {want}: job {id} runs on {have} node(s)"
            )));
        }
        // Every node gets its part, those past `want` too: their srun takes no part but
        // records the step, so that step ids stay alike on every node.
        let nodes: Vec<String> = ranks.iter().map(|(_, n)| n.to_string()).collect();
        if let Some(gone) = nodes.iter().find(|n| !self.fleet.conns.contains_key(*n)) {
            return Err(Refusal::failed_precondition(format!(
                "job {id}'s node {gone} is not connected to the controller now"
            )));
        }
        Ok(StepTarget {
            nodes,
            attempt: j.attempt,
        })
    }

    /// Ends running allocation `id` as COMPLETED (its owner's shell ended, with
    /// `shell_exit` when it says): its holder on each node is stopped, and the job ends
    /// when they report.
    pub(crate) fn release_allocation(
        &mut self,
        actor: &Actor,
        id: u64,
        shell_exit: Option<i32>,
    ) -> Result<Effects, Refusal> {
        let j = self.own_job(actor, id, "release")?;
        if !is_allocation(j) {
            return Err(Refusal::failed_precondition(format!(
                "job {id} is not an interactive allocation (gpuctl alloc); gpuctl cancel ends other jobs"
            )));
        }
        match j.state {
            JobState::Running => {}
            JobState::Pending => {
                return Err(Refusal::failed_precondition(format!(
                    "job {id} is still pending; gpuctl cancel {id} gives it up"
                )));
            }
            s => {
                return Err(Refusal::failed_precondition(format!(
                    "job {id} already ended ({})",
                    state_name(s)
                )));
            }
        }
        let why = match shell_exit {
            Some(c) => format!(
                "allocation released by {} (its command exited {})",
                actor.user,
                c.clamp(0, 255)
            ),
            None => format!("allocation released by {}", actor.user),
        };
        let (sends, _) = self.kill_running(id, &why, gpuctl_sched::job::JobState::Completed);
        tracing::info!(job = id, by = %actor.user, "allocation released");
        let mut effects = Effects::wake();
        effects.sends.extend(sends);
        Ok(effects)
    }
}

/// The most arguments a step's command line has, and bytes in all.
pub const MAX_STEP_ARGS: usize = 256;
pub const MAX_STEP_ARGS_BYTES: usize = 64 << 10;
/// The signals a client may send a step (by name, as `kill -s` takes them); the
/// controller passes no other to the step's nodes.
pub const STEP_SIGNALS: [&str; 7] = ["INT", "TERM", "HUP", "QUIT", "USR1", "USR2", "KILL"];

/// What a client opens a step with: its command line (srun's options, `--`, the
/// command), its TERM, and its window (rows, columns) if it has a terminal.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpenStep {
    pub args: Vec<String>,
    pub term: String,
    pub size: Option<(u32, u32)>,
}

/// What a client may ask of a step it opens: a command line of bounded size without
/// NUL bytes, a plausible terminal name and window.
pub fn check_open(open: &OpenStep) -> Result<(), Refusal> {
    let bad = |m: String| Err(Refusal::invalid_argument(m));
    if open.args.is_empty() {
        return bad("a step needs a command".into());
    }
    if open.args.len() > MAX_STEP_ARGS {
        return bad(format!(
            "a step's command has {} arguments, over the limit of {MAX_STEP_ARGS}",
            open.args.len()
        ));
    }
    let bytes: usize = open.args.iter().map(String::len).sum();
    if bytes > MAX_STEP_ARGS_BYTES {
        return bad(format!(
            "a step's command is {bytes} bytes, over the limit of {MAX_STEP_ARGS_BYTES}"
        ));
    }
    if open.args.iter().any(|a| a.contains('\0')) {
        return bad("a step's command holds a NUL byte".into());
    }
    let term_ok = open.term.len() <= 64
        && open
            .term
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
    if !term_ok {
        return bad(format!(
            "TERM {:?} is not a terminal name",
            crate::text::shown(&open.term, 80)
        ));
    }
    if let Some((rows, cols)) = open.size
        && (rows > 4096 || cols > 4096)
    {
        return bad(format!("a window of {cols}x{rows} is too large"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(args: &[&str]) -> OpenStep {
        OpenStep {
            args: args.iter().map(|s| s.to_string()).collect(),
            size: Some((40, 120)),
            term: "xterm-256color".into(),
        }
    }

    #[test]
    fn open_steps_are_checked() {
        assert!(check_open(&open(&["--", "bash"])).is_ok());
        assert!(check_open(&open(&[])).is_err());
        assert!(check_open(&open(&["a\0b"])).is_err());
        let long = vec!["x"; MAX_STEP_ARGS + 1];
        assert!(check_open(&open(&long)).is_err());
        let big = "y".repeat(MAX_STEP_ARGS_BYTES + 1);
        assert!(check_open(&open(&[&big])).is_err());
        let mut o = open(&["bash"]);
        o.term = "xterm\u{1b}[31m".into();
        assert!(check_open(&o).is_err());
        o.term = String::new();
        o.size = Some((100_000, 1));
        assert!(check_open(&o).is_err());
    }
}
