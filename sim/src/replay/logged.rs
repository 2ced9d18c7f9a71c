//! The replay's controller state, changed only through log entries
//! (`gpuctl_core::log`), as the daemon changes its own: the replay decides (admission,
//! plans) and applies each entry. An observer sees every entry with the state it left:
//! the log that replicas apply, and the states they must pass through
//! (`sim/tests/log_replicas.rs`).

use gpuctl_core::log::{Applied, Change, Entry};
use gpuctl_core::{Cluster, Effects, Refusal};
use gpuctl_sched::Millis;

/// Called after each entry applies, with the state it left.
pub type Observer<'a> = &'a mut dyn FnMut(&Entry, &Cluster);

pub struct Logged<'a> {
    c: Cluster,
    observer: Option<Observer<'a>>,
}

impl<'a> Logged<'a> {
    pub fn new(c: Cluster, observer: Option<Observer<'a>>) -> Logged<'a> {
        Logged { c, observer }
    }

    /// Applies a change decided at `now`.
    pub fn apply(&mut self, now: Millis, change: Change) -> (Result<Applied, Refusal>, Effects) {
        let entry = Entry::new(now, change);
        match &mut self.observer {
            None => self.c.apply(entry),
            Some(observe) => {
                let out = self.c.apply(entry.clone());
                observe(&entry, &self.c);
                out
            }
        }
    }

    /// `apply` for a change never refused (admitted jobs, reports): its effects.
    pub fn apply_sure(&mut self, now: Millis, change: Change) -> Effects {
        let (answer, effects) = self.apply(now, change);
        debug_assert!(answer.is_ok(), "{answer:?}");
        effects
    }

    pub fn into_inner(self) -> Cluster {
        self.c
    }

    /// What a store would write: the replay keeps nothing.
    pub fn take_changes(&mut self) {
        self.c.take_changes();
    }
}

impl std::ops::Deref for Logged<'_> {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.c
    }
}
