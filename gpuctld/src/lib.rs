//! gpuctld, the gpuctl controller.
//!
//! Modules:
//! - `sched`: the pure scheduler core (cluster view + queue + config + now -> plan and
//!   typed reasons). No I/O, no clock, no tokio.
//! - `controller`: the in-memory cluster state and every operation on it; applies plans,
//!   persists, dispatches to agents.
//! - `auth`: who a caller is (Unix-socket peer credentials, API tokens), admin checks.
//! - `store`: sled persistence with a schema version.
//! - `server`: the tonic services (`Controller` for users, `AgentLink` for agents).
//! - `config`: the controller's TOML configuration and its defaults.
//! - `daemon`: wiring: open the store, bind, serve, schedule, shut down on a signal.
//! - `trace`: readers for the Alibaba GPU trace and job CSVs (simulator, benchmarks).
//! - `bench`: the synthetic cluster and trace-mix queue the benchmarks measure.

pub mod auth;
pub mod bench;
pub mod config;
pub mod controller;
pub mod daemon;
pub mod metrics;
pub mod sched;
pub mod server;
pub mod sim;
pub mod store;
pub mod trace;
