//! Whether a submit may leave its pass to later (Slurm's `batch_sched_delay`): after a
//! pass that left jobs waiting, the room a new GPU job would have (`policy::gpu_room`)
//! is kept; a submit of a job that needs a GPU and does not fit it needs no pass of its
//! own, and the submits of a loop against a full cluster share one. Pure: the shell
//! asks and keeps the timer.

use crate::record::Job;

use crate::policy::GpuRoom;
use crate::state::Cluster;

/// What the shell does about the submits that left their pass to later, once a pass
/// has settled the room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deferred {
    /// None was left.
    None,
    /// One may fit after all: run a pass now.
    PassNow,
    /// None fits: their pass comes with the deferred timer.
    PassSoon,
}

/// The room the submits between two passes are measured against, and the least a
/// deferred one asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassRoom {
    room: GpuRoom,
    /// The least CPU and memory a submit that deferred its pass since the last pass
    /// took its input asked for.
    deferred: Option<(u32, u64)>,
}

impl Default for PassRoom {
    fn default() -> Self {
        PassRoom {
            room: GpuRoom::Any,
            deferred: None,
        }
    }
}

impl PassRoom {
    /// The room now.
    pub fn room(&self) -> GpuRoom {
        self.room
    }

    /// An event that wakes the scheduler (a job's end, a node's change): anything may
    /// fit until its pass has run.
    pub fn woken(&mut self) {
        self.room = GpuRoom::Any;
    }

    /// Whether the submit of `j` leaves its pass to later (and notes what it asked for).
    pub fn defers(&mut self, c: &Cluster, j: &Job) -> bool {
        let room = self.room;
        let Some(req) = c
            .deferrable(j)
            .filter(|r| !room.admits(r.cpu_milli, r.memory_bytes))
        else {
            return false;
        };
        let (cpu, memory) = self.deferred.unwrap_or((u32::MAX, u64::MAX));
        self.deferred = Some((cpu.min(req.cpu_milli), memory.min(req.memory_bytes)));
        true
    }

    /// A pass took its input: the submits deferred so far are in it.
    pub fn pass_started(&mut self) {
        self.deferred = None;
    }

    /// At the end of a pass (`waiting`: jobs still wait; `room`: `gpu_room` after its
    /// plan): the room submits are measured against from now on (none while a window's
    /// floor may preempt: then anything may be made to fit), and what becomes of the
    /// submits that deferred since the pass took its input.
    pub fn settle(&mut self, c: &Cluster, waiting: bool, room: GpuRoom, now: i64) -> Deferred {
        self.room = if waiting && !c.floors_preempt(now) {
            room
        } else {
            GpuRoom::Any
        };
        match self.deferred {
            None => Deferred::None,
            Some((cpu, memory)) if self.room.admits(cpu, memory) => Deferred::PassNow,
            Some(_) => Deferred::PassSoon,
        }
    }
}
