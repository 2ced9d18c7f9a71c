//! What the controller that agents talk to keeps about their connections, and changes
//! outside the log: the challenge nonces it handed out, each session's replay window,
//! when each agent was last heard, and the starts sent on each stream (`Leader`). The
//! rest of the cluster's state changes through `Cluster::apply(Entry)` only; this is the
//! one other door, and it opens on these records alone.
//!
//! On Raft only the leader keeps them (a follower serves no agent): a new leader hears
//! every agent afresh (`hear_all`), and what a session's bookkeeping decides that others
//! must know travels in an entry (a heartbeat's `not_run` starts, the watchdog's
//! `silent_nodes`, an `Attach` after `check_attach`).

use crate::error::Refusal;
use crate::event::{Heartbeat, Register};
use crate::replay::Signed;
use crate::state::Cluster;

/// The leader's desk: the session bookkeeping of a `Cluster` (`Cluster::leader`).
pub struct Leader<'a> {
    c: &'a mut Cluster,
}

impl Cluster {
    /// The session bookkeeping, changed outside the log (see the module's doc).
    pub fn leader(&mut self) -> Leader<'_> {
        Leader { c: self }
    }
}

impl Leader<'_> {
    /// Hands out `nonce` (random, from the shell) for the next Attach of `node`: valid
    /// for 30 s, single use; a node holds at most 8. Answers the node timeout (ms) the
    /// agent is held to.
    pub fn challenge(&mut self, node: &str, nonce: Vec<u8>, now: i64) -> u64 {
        self.c.challenge(node, nonce, now)
    }

    /// Checks that a request belongs to the node's live session and was not seen on it
    /// before (a replay), and counts the agent as heard from.
    pub fn check_session(&mut self, node: &str, signed: &Signed, now: i64) -> Result<(), Refusal> {
        self.c.check_session(node, signed, now)
    }

    /// The session of `node`'s connection `generation`, recording the start of
    /// `(job, attempt)` if the command sent as its `seq`th is one; `None` when that
    /// connection is no longer the node's live one.
    pub fn command_sent(
        &mut self,
        node: &str,
        generation: u64,
        seq: u64,
        start: Option<(u64, u32)>,
    ) -> Option<Vec<u8>> {
        self.c.command_sent(node, generation, seq, start)
    }

    /// What only the controller an agent attaches to checks: the request's shape, the
    /// challenge nonce it answers (taken: single use), and that no other agent holds
    /// the name; an `Attach` entry then attaches it.
    pub fn check_attach(&mut self, req: &Register, now: i64) -> Result<(), Refusal> {
        self.c.check_attach(req, now)
    }

    /// The starts sent on the node's session that its agent, by this heartbeat, has
    /// handled without running them (forgotten here; the heartbeat's entry carries them).
    pub fn starts_not_run(&mut self, req: &Heartbeat) -> Vec<(u64, u32)> {
        self.c.starts_not_run(req)
    }

    /// Counts every node as heard from at `now` (a new leader gives each agent a full
    /// node timeout to attach to it).
    pub fn hear_all(&mut self, now: i64) {
        self.c.hear_all(now);
    }

    /// Ends every agent session (one controller closing every agent stream at shutdown).
    pub fn end_sessions(&mut self) {
        self.c.end_sessions();
    }
}
