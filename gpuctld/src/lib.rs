//! gpuctld, the gpuctl controller.
//!
//! Modules:
//! - `sched`: the pure scheduler core (cluster view + queue + config + now -> plan and
//!   typed reasons). No I/O, no clock, no tokio.
//! - `controller`: the in-memory cluster state and every operation on it; applies plans,
//!   persists, dispatches to agents.
//! - `store`: sled persistence with a schema version.
//! - `server`: the tonic services (`Controller` for users, `AgentLink` for agents).
//! - `config`: the controller's TOML configuration and its defaults.
//! - `daemon`: wiring: open the store, bind, serve, schedule, shut down on a signal.

pub mod config;
pub mod controller;
pub mod daemon;
pub mod sched;
pub mod server;
pub mod store;
