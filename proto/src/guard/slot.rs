//! A connection's slot and its class: what the caps count it as.
//!
//! - **Pending**: a TLS handshake under way (who it is is not known yet). Counted per
//!   address apart from the others; when an address has `max_per_address` pending, its
//!   oldest pending handshake is closed for the new one, so a peer cycling slow
//!   handshakes cannot keep an agent of the same address from finishing its own.
//! - **Unauthenticated**: nothing proved yet. Capped per address (per uid on the Unix
//!   socket) and in all at `max_connections - authenticated_reserve`; with
//!   `auth_timeout`, closed that long after accept unless it authenticates, and a new
//!   connection of an address at its cap closes the address's oldest unauthenticated
//!   one instead of being refused: a token's user gets in to send its token, however
//!   many connections others of its address hold.
//! - **Authenticated**: a client certificate under the cluster CA (agents, members), or
//!   a request that passed its checks (an API token, an agent's signature, a member's
//!   MAC: the server calls [`Auth::authenticated`]). Not counted against any address:
//!   all local users and every job of a node share one address with its agent, and
//!   their connections must not lock the agent or a token's user out.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use super::{Peer, Refusal, Stats};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Pending,
    Unauthenticated,
    Authenticated,
    /// Closed for a newer connection of its address: counts for nothing while it goes.
    Evicted,
}

/// One connection's place under its listener's caps; gives it back when dropped.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) stats: Arc<Stats>,
    pub(super) peer: Option<Peer>,
    class: Mutex<Class>,
    /// Told when a newer connection of the same address took its place (a handshake
    /// waits on it; a connection's reads are woken through `waker`).
    pub(super) evicted: tokio::sync::Notify,
    pub(super) waker: futures::task::AtomicWaker,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Slot {
    /// A slot of `class` for `peer` (counted in all already by the caller).
    pub(super) fn new(stats: Arc<Stats>, peer: Option<Peer>, class: Class) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            stats,
            peer,
            class: Mutex::new(class),
            evicted: tokio::sync::Notify::new(),
            waker: futures::task::AtomicWaker::new(),
        });
        if class == Class::Pending
            && let Some(p) = peer
        {
            let evict = {
                let mut pending = lock(&slot.stats.pending);
                let q = pending.entry(p).or_default();
                q.retain(|w| w.strong_count() > 0);
                q.push_back(Arc::downgrade(&slot));
                if q.len() > slot.stats.limits.max_per_address {
                    q.pop_front()
                } else {
                    None
                }
            };
            if let Some(old) = evict.and_then(|w| w.upgrade()) {
                old.evict();
            }
        }
        slot
    }

    pub(super) fn class(&self) -> Class {
        *lock(&self.class)
    }

    /// Leaves `Pending` (a TLS handshake done) for what the peer proved: a client
    /// certificate makes it authenticated; without one it must fit under the caps on
    /// unauthenticated connections.
    pub(super) fn settle(self: &Arc<Self>, certificate: bool) -> Result<(), Refusal> {
        if certificate {
            self.set(Class::Authenticated);
            return Ok(());
        }
        match self.stats.admit_unauthenticated(self.peer) {
            Ok(()) => {}
            // Room made by closing the address's oldest unauthenticated connection.
            Err(Refusal::PerAddress) if self.stats.limits.auth_timeout.is_some() => {
                match self.stats.oldest_unauthenticated(self.peer) {
                    Some(old) => {
                        old.evict();
                        self.stats.admit_unauthenticated(self.peer)?;
                    }
                    None => return Err(Refusal::PerAddress),
                }
            }
            Err(e) => return Err(e),
        }
        self.leave(Class::Pending);
        *lock(&self.class) = Class::Unauthenticated;
        if let Some(p) = self.peer {
            let mut order = lock(&self.stats.unauthenticated_order);
            order.entry(p).or_default().push_back(Arc::downgrade(self));
        }
        Ok(())
    }

    /// Closes this connection for a newer one of its address.
    pub(super) fn evict(&self) {
        self.set(Class::Evicted);
        self.evicted.notify_one();
        self.waker.wake();
    }

    pub(super) fn is_evicted(&self) -> bool {
        self.class() == Class::Evicted
    }

    /// Moves to `to`, giving back what the class held.
    fn set(&self, to: Class) {
        let mut class = lock(&self.class);
        if *class == to {
            return;
        }
        self.leave(*class);
        *class = to;
    }

    /// Gives back the per-class counts of `class`.
    fn leave(&self, class: Class) {
        match class {
            Class::Authenticated | Class::Evicted => {}
            Class::Unauthenticated => {
                self.stats.unauthenticated.fetch_sub(1, Ordering::Relaxed);
                if let Some(p) = self.peer {
                    let mut open = lock(&self.stats.open);
                    if let Some(n) = open.get_mut(&p) {
                        *n -= 1;
                        if *n == 0 {
                            open.remove(&p);
                        }
                    }
                    drop(open);
                    self.forget(&self.stats.unauthenticated_order, p);
                }
            }
            Class::Pending => {
                if let Some(p) = self.peer {
                    self.forget(&self.stats.pending, p);
                }
            }
        }
    }

    /// Takes this slot (and any dropped one) out of `peer`'s queue in `queues`.
    fn forget(&self, queues: &Mutex<super::Queues>, peer: Peer) {
        let mut queues = lock(queues);
        if let Some(q) = queues.get_mut(&peer) {
            let me: *const Slot = self;
            q.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), me));
            if q.is_empty() {
                queues.remove(&peer);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.stats.total.fetch_sub(1, Ordering::Relaxed);
        let class = *lock(&self.class);
        self.leave(class);
    }
}

/// What the server holds of a connection (in its `TcpPeer`) to say that a request on
/// it authenticated: the connection then leaves the unauthenticated caps and deadline.
#[derive(Debug, Clone, Default)]
pub struct Auth(Weak<Slot>);

impl Auth {
    pub(super) fn of(slot: &Arc<Slot>) -> Auth {
        Auth(Arc::downgrade(slot))
    }

    /// The connection proved who it is (a valid token, signature or MAC).
    pub fn authenticated(&self) {
        if let Some(slot) = self.0.upgrade()
            && slot.class() == Class::Unauthenticated
        {
            slot.set(Class::Authenticated);
        }
    }

    /// Whether the connection has proved who it is (tests, metrics).
    pub fn is_authenticated(&self) -> bool {
        self.0
            .upgrade()
            .is_some_and(|s| s.class() == Class::Authenticated)
    }
}
