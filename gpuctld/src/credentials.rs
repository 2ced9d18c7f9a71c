//! Who may act: API tokens (users), join tokens and node identities (nodes). A change
//! of them is decided first (a secret drawn, a certificate signed, against the
//! credentials as they are) and then applied here, where it is checked again: one
//! controller applies it and writes it to its store; replicated controllers propose it
//! (`LogCredential`) and every member applies it alike, so a join token is used once
//! whichever member a node reached, and a node joined through one leader is known to
//! the next. Applying reads no clock (the entry's time is given) and does no I/O.

use std::collections::HashMap;

use gpuctl_core::Refusal;
use gpuctl_proto::store::log_credential::Change;
use gpuctl_proto::store::{
    self as st, LogCredential, StoredJoinToken, StoredNodeIdentity, StoredToken,
};

use crate::auth::Tokens;

/// Join tokens waiting to be used, at most.
pub const MAX_JOIN_TOKENS: usize = 10_000;

#[derive(Default)]
pub struct Credentials {
    /// API tokens, by the hash of their secret.
    pub api: Tokens,
    /// Join tokens waiting to be used, by the hash of their secret.
    pub joins: HashMap<String, StoredJoinToken>,
    /// Every node that ever joined, by name (revoked ones included).
    pub nodes: HashMap<String, StoredNodeIdentity>,
}

impl Credentials {
    pub fn new(
        api: Vec<StoredToken>,
        joins: Vec<StoredJoinToken>,
        nodes: Vec<StoredNodeIdentity>,
    ) -> Credentials {
        Credentials {
            api: Tokens::new(api),
            joins: joins.into_iter().map(|t| (t.hash.clone(), t)).collect(),
            nodes: nodes.into_iter().map(|n| (n.node.clone(), n)).collect(),
        }
    }

    pub fn from_records(r: st::Credentials) -> Credentials {
        Credentials::new(r.api_tokens, r.join_tokens, r.identities)
    }

    /// Every record, in a stable order (a snapshot's).
    pub fn records(&self) -> st::Credentials {
        let mut joins: Vec<_> = self.joins.values().cloned().collect();
        joins.sort_by(|a, b| a.hash.cmp(&b.hash));
        let mut nodes: Vec<_> = self.nodes.values().cloned().collect();
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        st::Credentials {
            api_tokens: self.api.list(),
            join_tokens: joins,
            identities: nodes,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.api.list().is_empty() && self.joins.is_empty() && self.nodes.is_empty()
    }

    /// Join tokens not expired at `at`.
    pub fn live_joins(&self, at: i64) -> usize {
        self.joins.values().filter(|t| t.expires_ms > at).count()
    }

    /// Applies a change decided at `at`, or refuses it (the credentials unchanged).
    pub fn apply(&mut self, at: i64, change: &LogCredential) -> Result<(), Refusal> {
        let Some(change) = &change.change else {
            return Err(Refusal::invalid_argument("an empty credential change"));
        };
        match change {
            Change::ApiToken(t) => {
                self.api.insert(t.clone());
                Ok(())
            }
            Change::ApiTokenRevoked(id) => match self.api.remove(id) {
                Some(_) => Ok(()),
                None => Err(Refusal::not_found(format!("no token with id {id:?}"))),
            },
            Change::JoinToken(t) => {
                // Expired ones go now (at the entry's time, alike everywhere).
                self.joins.retain(|_, t| t.expires_ms > at);
                if self.joins.len() >= MAX_JOIN_TOKENS {
                    return Err(Refusal::resource_exhausted(format!(
                        "{MAX_JOIN_TOKENS} join tokens are waiting to be used; use or let some expire first"
                    )));
                }
                self.joins.insert(t.hash.clone(), t.clone());
                Ok(())
            }
            Change::Joined(j) => self.joined(at, j),
            Change::Renewed(id) => {
                self.same_epoch(id)?;
                self.nodes.insert(id.node.clone(), id.clone());
                Ok(())
            }
            Change::Revoked(id) => {
                self.same_epoch(id)?;
                self.nodes.insert(id.node.clone(), id.clone());
                Ok(())
            }
        }
    }

    fn joined(&mut self, at: i64, j: &st::LogJoined) -> Result<(), Refusal> {
        let Some(id) = &j.identity else {
            return Err(Refusal::invalid_argument("a join without an identity"));
        };
        let live = self.joins.get(&j.token_hash).filter(|t| t.expires_ms > at);
        if live.is_none() {
            return Err(Refusal::failed_precondition(
                "unknown, expired or already used join token (create another with `gpuctl admin join-token create`)",
            ));
        }
        let epoch = self.nodes.get(&id.node).map_or(0, |n| n.epoch);
        if id.epoch != epoch + 1 {
            return Err(Refusal::failed_precondition(format!(
                "node {} joined again meanwhile: join once more",
                gpuctl_proto::text::shown(&id.node, 64)
            )));
        }
        self.joins.remove(&j.token_hash);
        self.nodes.insert(id.node.clone(), id.clone());
        Ok(())
    }

    /// A renewal or revocation decided on the node's identity as it still is.
    fn same_epoch(&self, id: &StoredNodeIdentity) -> Result<(), Refusal> {
        match self.nodes.get(&id.node) {
            Some(now) if now.epoch == id.epoch && !now.revoked => Ok(()),
            _ => Err(Refusal::failed_precondition(format!(
                "node {} was revoked or joined again meanwhile",
                gpuctl_proto::text::shown(&id.node, 64)
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(node: &str, epoch: u64) -> StoredNodeIdentity {
        StoredNodeIdentity {
            node: node.into(),
            epoch,
            ..Default::default()
        }
    }

    fn change(c: Change) -> LogCredential {
        LogCredential { change: Some(c) }
    }

    #[test]
    fn a_join_token_is_used_once_and_not_after_it_expired() {
        let mut c = Credentials::default();
        let token = StoredJoinToken {
            hash: "h".into(),
            expires_ms: 1_000,
            ..Default::default()
        };
        c.apply(0, &change(Change::JoinToken(token))).unwrap();
        let join = |epoch| {
            change(Change::Joined(st::LogJoined {
                token_hash: "h".into(),
                identity: Some(identity("n1", epoch)),
            }))
        };
        // Expired when the join applies: refused, nothing changed.
        let mut late = c.clone_for_test();
        assert!(late.apply(1_000, &join(1)).is_err());
        assert!(late.nodes.is_empty());
        // A wrong epoch (another join got there first) is refused, the token kept.
        assert!(c.apply(10, &join(2)).is_err());
        assert!(c.joins.contains_key("h"));
        c.apply(10, &join(1)).unwrap();
        assert_eq!(c.nodes["n1"].epoch, 1);
        // Used up: the same join again is refused.
        assert!(c.apply(20, &join(2)).is_err());
    }

    #[test]
    fn a_renewal_decided_before_a_revocation_does_not_undo_it() {
        let mut c = Credentials::new(Vec::new(), Vec::new(), vec![identity("n1", 3)]);
        let revoked = StoredNodeIdentity {
            revoked: true,
            ..identity("n1", 3)
        };
        c.apply(5, &change(Change::Revoked(revoked))).unwrap();
        assert!(
            c.apply(6, &change(Change::Renewed(identity("n1", 3))))
                .is_err()
        );
        assert!(c.nodes["n1"].revoked);
    }

    #[test]
    fn records_round_trip() {
        let mut c = Credentials::default();
        let t = StoredToken {
            id: "a1".into(),
            user: "alice".into(),
            hash: "x".into(),
            ..Default::default()
        };
        c.apply(1, &change(Change::ApiToken(t))).unwrap();
        let again = Credentials::from_records(c.records());
        assert_eq!(again.records(), c.records());
        assert!(
            c.apply(2, &change(Change::ApiTokenRevoked("zz".into())))
                .is_err()
        );
        c.apply(2, &change(Change::ApiTokenRevoked("a1".into())))
            .unwrap();
        assert!(c.is_empty());
    }

    impl Credentials {
        fn clone_for_test(&self) -> Credentials {
            Credentials::from_records(self.records())
        }
    }
}
