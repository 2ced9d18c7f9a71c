//! gpuctl-core: the controller's cluster state as a state machine.
//!
//! `Cluster` holds jobs, nodes and agent sessions. Each operation (a submit, a cancel,
//! an agent attaching, reporting or falling silent, a scheduling pass's plan) takes
//! `now` and returns `Effects`: the commands to send to agents once what changed is
//! durable, whether a pass is due, which agent streams to close. What must be written
//! is taken with `Cluster::take_changes`. No store, no clock, no sockets, no async: the
//! controller's shell (`gpuctld`) owns those and the lock, and the tests drive the
//! state directly and read the effects (the agent side's recording double).
//!
//! Modules: `state` (the cluster and its views), `jobs` (the job table, the one place a
//! job's state changes), `ops` (submit and the scheduling pass), `agents` (sessions,
//! heartbeats, reports, failed nodes), `users` (cancel, drain, node listings),
//! `validate` (what a job must be to be queued), `begin` (jobs held until a time), `fairshare` (charging usage, the
//! fair-share factor), `policy` (QoS caps), `holds` (hold,
//! release, requeue), `interactive` (allocations and steps opened from outside a
//! job), `filter` (listings' filters), `partitions` (node sets and their limits),
//! `windows` (time-of-day windows), `log` (the entries that change the state, and
//! `Cluster::apply`), `reconfig` (a new config taken while running),
//! `retention`, `config`, `error`; `node` (a node's record, its GPUs, their samples)
//! `event` (what agents tell the controller) and `command`
//! (what the controller tells them); `view` (what the state answers users) are the state's own words for them.

pub use gpuctl_base::{replay, text};

pub mod agents;
pub mod answers;
pub mod begin;
pub mod check;
pub mod colocate;
pub mod command;
pub mod config;
pub mod efficiency;
pub mod error;
pub mod event;
pub mod exclusive;
pub mod explain;
pub mod fairshare;
pub mod filter;
pub mod fleet;
pub mod health;
pub mod holds;
pub mod idle;
pub mod interactive;
pub mod jobs;
pub mod leader;
pub mod log;
pub mod mail;
pub mod mig;
pub mod node;
pub mod operations;
pub mod opportunistic;
pub mod ops;
pub mod partitions;
pub mod policy;
pub mod power;
pub mod reconfig;
pub mod record;
pub mod report;
pub mod request;
pub mod restore;
pub mod retention;
pub mod room;
pub mod state;
pub mod steps;
pub mod update;
pub mod usage;
pub mod users;
pub mod validate;
pub mod view;
pub mod windows;

pub use config::Config;
pub use error::{Actor, Kind, Refusal};
pub use state::{Changes, Cluster, Effects, ViewCursor};
