//! The nodes and their agents, one owner: each node's record, the live agent sessions,
//! the challenges handed out for the next attach, when each agent was last heard from,
//! the GPU samples of their latest heartbeats, and which records changed since the
//! shell last wrote them. The cluster's operations on agents are in `agents.rs`; the
//! shell reads through the methods here and changes nothing itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::node::{GpuMetrics, Node};

/// The most challenges a node holds at once (`Cluster::challenge`).
pub const MAX_CHALLENGES: usize = 8;

/// An attached agent's session, as the cluster state knows it (the connection itself,
/// its command stream, is the shell's).
pub struct Conn {
    /// Which registration this is; a stale connection's drop must not mark a newer one down.
    pub generation: u64,
    /// The session (the Attach nonce) and the request numbers seen on it.
    pub session: Vec<u8>,
    pub window: crate::replay::ReplayWindow,
    /// The identity the agent keeps in its state dir, and where it connected from.
    pub agent_id: String,
    pub peer: String,
    /// Starts sent on this session and not yet seen run: (command number, job, attempt).
    pub starts: Vec<(u64, u64, u32)>,
}

/// Nodes and agent sessions (see the module's doc).
#[derive(Default)]
pub struct Fleet {
    pub(crate) nodes: BTreeMap<String, Node>,
    pub(crate) conns: HashMap<String, Conn>,
    /// Nonces handed out by `challenge`, per node, with when they expire (Unix ms).
    pub(crate) challenges: HashMap<String, Vec<(Vec<u8>, i64)>>,
    /// When a node's agent was last heard from (heartbeat, attach or report), in memory.
    pub(crate) last_heard: HashMap<String, i64>,
    /// The newest session's generation (each attach takes the next one).
    pub(crate) generation: u64,
    /// The latest GPU metrics each agent sent with its heartbeat (memory only).
    pub(crate) metrics: HashMap<String, Vec<GpuMetrics>>,
    /// Nodes changed since the last `Cluster::take_changes`.
    pub(crate) changed: BTreeSet<String>,
}

impl Fleet {
    /// Every node's record, by name.
    pub fn nodes(&self) -> &BTreeMap<String, Node> {
        &self.nodes
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name)
    }

    /// The live session of `node`'s agent, if it is attached.
    pub fn session(&self, node: &str) -> Option<&Conn> {
        self.conns.get(node)
    }

    /// Every attached node's session: (node, generation).
    pub fn sessions(&self) -> Vec<(String, u64)> {
        (self.conns.iter())
            .map(|(n, c)| (n.clone(), c.generation))
            .collect()
    }

    /// When `node`'s agent was last heard from (Unix ms).
    pub fn last_heard(&self, node: &str) -> Option<i64> {
        self.last_heard.get(node).copied()
    }

    /// Ends every session (the shell closes every agent stream, at shutdown).
    pub(crate) fn end_sessions(&mut self) {
        self.conns.clear();
    }

    /// Counts every node as heard from at `now` (none goes silent before a full node
    /// timeout from now).
    pub(crate) fn hear_all(&mut self, now: i64) {
        for name in self.nodes.keys() {
            // A failed node's (far in the future) stays: it is heard from again only
            // when it re-attaches.
            let heard = self.last_heard.entry(name.clone()).or_insert(now);
            if *heard < now {
                *heard = now;
            }
        }
    }

    /// The first of the fleet's own invariants that does not hold, if any: each record
    /// is filed under its name; sessions, hearing times and samples are of known nodes;
    /// sessions have distinct generations, none newer than the newest; no node holds
    /// more than `MAX_CHALLENGES` challenges.
    pub fn check(&self) -> Result<(), String> {
        if let Some((k, n)) = self.nodes.iter().find(|(k, n)| **k != n.name) {
            return Err(format!("node record {:?} filed under {k:?}", n.name));
        }
        let unknown = |what: &str, name: &String| -> Result<(), String> {
            if self.nodes.contains_key(name) {
                Ok(())
            } else {
                Err(format!("{what} of unknown node {name}"))
            }
        };
        for name in self.conns.keys() {
            unknown("a session", name)?;
        }
        for name in self.last_heard.keys() {
            unknown("a hearing time", name)?;
        }
        for name in self.metrics.keys() {
            unknown("GPU samples", name)?;
        }
        let mut generations: Vec<u64> = self.conns.values().map(|c| c.generation).collect();
        generations.sort_unstable();
        if let Some(w) = generations.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("two sessions of generation {}", w[0]));
        }
        if let Some(&g) = generations.last().filter(|&&g| g > self.generation) {
            return Err(format!(
                "a session of generation {g}, past the newest {}",
                self.generation
            ));
        }
        if let Some((n, l)) = self
            .challenges
            .iter()
            .find(|(_, l)| l.len() > MAX_CHALLENGES)
        {
            return Err(format!("{n} holds {} challenges", l.len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(generation: u64) -> Conn {
        Conn {
            generation,
            session: Vec::new(),
            window: Default::default(),
            agent_id: String::new(),
            peer: String::new(),
            starts: Vec::new(),
        }
    }

    fn fleet() -> Fleet {
        let mut f = Fleet::default();
        for n in ["n1", "n2"] {
            let node = Node {
                name: n.into(),
                ..Node::default()
            };
            f.nodes.insert(n.into(), node);
        }
        f.conns.insert("n1".into(), conn(1));
        f.conns.insert("n2".into(), conn(2));
        f.generation = 2;
        f
    }

    #[test]
    fn each_broken_invariant_is_named() {
        assert_eq!(fleet().check(), Ok(()));
        let broken = |edit: &dyn Fn(&mut Fleet)| {
            let mut f = fleet();
            edit(&mut f);
            f.check().unwrap_err()
        };
        let e = broken(&|f| f.nodes.get_mut("n2").unwrap().name = "n3".into());
        assert!(e.contains("filed under \"n2\""), "{e}");
        let e = broken(&|f| drop(f.conns.insert("n9".into(), conn(1))));
        assert!(e.contains("a session of unknown node n9"), "{e}");
        let e = broken(&|f| {
            f.last_heard.insert("n9".into(), 0);
        });
        assert!(e.contains("hearing time of unknown node n9"), "{e}");
        let e = broken(&|f| drop(f.metrics.insert("n9".into(), Vec::new())));
        assert!(e.contains("GPU samples of unknown node n9"), "{e}");
        let e = broken(&|f| f.conns.get_mut("n2").unwrap().generation = 1);
        assert!(e.contains("two sessions of generation 1"), "{e}");
        let e = broken(&|f| f.generation = 1);
        assert!(e.contains("past the newest 1"), "{e}");
        let e = broken(&|f| drop(f.challenges.insert("n1".into(), vec![(vec![], 0); 9])));
        assert!(e.contains("n1 holds 9 challenges"), "{e}");
    }
}
