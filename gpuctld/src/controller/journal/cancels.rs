//! A large cancel of pending jobs made durable as one record (issue 59): alone, a
//! cancel's answer waits for the store to hold what it changed, and writing 10,000 job
//! records was a third of `gpuctl cancel --me` over 10,000 queued jobs (sled inserts one
//! key at a time, 1.3-2 µs each, under the lock). Such a cancel is written as one
//! `cancel/<seq>` record (`Store::put_cancel`: its time, reason and jobs); once the
//! answer is out, its jobs' records follow in parts, each part written atomically with
//! the cancel record shrunk to the jobs left (`Store::settle_cancel`). At start,
//! `restore` applies each cancel record left again to its jobs still pending
//! (`gpuctl_core::jobs::PendingCancel`; the core's `cancel_records` test holds that this
//! gives the records the cancel left).
//!
//! Order: a job of an open cancel record keeps its pending record on disk, so any later
//! change that writes or deletes one of them first writes every open cancel's jobs (as
//! they are now) and drops the records (`before_writing`): a later record is never
//! older than the cancel's.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use gpuctl_core::jobs::{Changes, PendingCancel};

use crate::controller::{Controller, Shared};
use crate::store::StoreError;

/// A cancel that ends at least this many pending jobs is written as one record.
const ONE_RECORD_AT: usize = 256;
/// Jobs written per hold of the lock once the answer is out.
const SETTLE_PART: usize = 2_000;

/// The cancels written as one record whose jobs' records are not all written yet.
#[derive(Default)]
pub(crate) struct OpenCancels {
    next_seq: u64,
    open: BTreeMap<u64, PendingCancel>,
    ids: HashSet<u64>,
}

impl OpenCancels {
    /// None open; the next record numbered after `last` (those read at start).
    pub(crate) fn after(last: Option<u64>) -> OpenCancels {
        OpenCancels {
            next_seq: last.map_or(0, |s| s + 1),
            ..OpenCancels::default()
        }
    }

    fn touches(&self, changes: &Changes) -> bool {
        !self.ids.is_empty()
            && (changes.put.iter())
                .chain(&changes.delete)
                .any(|id| self.ids.contains(id))
    }
}

impl Controller {
    /// Before `changes` are written: an open cancel whose jobs they touch is written
    /// out first (`settle_part`, all of it), and each large cancel among them becomes
    /// one record, its jobs taken out of `changes.put`.
    pub(super) fn before_writing(
        &self,
        c: &mut Shared,
        changes: &mut Changes,
    ) -> Result<(), StoreError> {
        if c.cancels.touches(changes) {
            while self.settle_part(c, usize::MAX)? {}
        }
        for cancel in std::mem::take(&mut changes.cancels) {
            let ids = changes.deferrable(&cancel);
            if ids.len() < ONE_RECORD_AT {
                continue;
            }
            let cancel = PendingCancel { ids, ..cancel };
            let seq = c.cancels.next_seq;
            c.cancels.next_seq += 1;
            self.store.put_cancel(seq, &cancel)?;
            for id in &cancel.ids {
                changes.put.remove(id);
                c.cancels.ids.insert(*id);
            }
            c.cancels.open.insert(seq, cancel);
        }
        Ok(())
    }

    /// Writes up to `max` jobs of the oldest open cancel as they are now, with its
    /// record shrunk to the jobs left (or gone), in one batch. Answers whether any are
    /// left open.
    fn settle_part(&self, c: &mut Shared, max: usize) -> Result<bool, StoreError> {
        let Some(mut entry) = c.cancels.open.first_entry() else {
            return Ok(false);
        };
        let seq = *entry.key();
        let cancel = entry.get_mut();
        let part: Vec<u64> = {
            let n = cancel.ids.len().min(max);
            cancel.ids.drain(..n).collect()
        };
        let jobs: Vec<_> = part
            .iter()
            .filter_map(|id| c.core.jobs().get(*id))
            .collect();
        let left = (!cancel.ids.is_empty()).then_some(&*cancel);
        self.store.settle_cancel(seq, &jobs, left)?;
        if left.is_none() {
            entry.remove();
        }
        for id in &part {
            c.cancels.ids.remove(id);
        }
        Ok(!c.cancels.open.is_empty())
    }

    /// Once a cancel's answer is out: its jobs' records, written in parts on a blocking
    /// thread (each part a short hold of the lock), if any cancel is open.
    pub(crate) fn settle_cancels_soon(self: &Arc<Self>) {
        if self.lock().cancels.open.is_empty() {
            return;
        }
        let ctl = self.clone();
        tokio::task::spawn_blocking(move || {
            loop {
                match ctl.step(false, |c| ctl.settle_part(c, SETTLE_PART)) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        // The cancel record stays: the next change that touches its
                        // jobs, or the next start, writes them.
                        tracing::error!("writing a cancel's job records: {e}");
                        break;
                    }
                }
            }
        });
    }
}
