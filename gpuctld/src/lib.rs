//! gpuctld, the gpuctl controller.
//!
//! Modules:
//! - `controller`: the shell around the cluster state machine (`gpuctl-core`): the
//!   lock, the store, the agents' command streams, the clock; applies plans, persists,
//!   dispatches to agents.
//! - `auth`: who a caller is (Unix-socket peer credentials, API tokens), admin checks.
//! - `pki`: who a node is: the cluster CA, join tokens, node certificates and keys.
//! - `store`: sled persistence with a schema version.
//! - `server`: the tonic services (`Controller` for users, `AgentLink` for agents).
//! - `metrics`, `web`: the Prometheus endpoint and the read-only web page.
//! - `daemon`: wiring: open the store, bind, serve, schedule, shut down on a signal.
//!
//! Protobuf meets the state machine's own types in one place, `gpuctl_proto`'s `record`,
//! `convert` and `wire` (its `core` feature). The scheduler core is the `gpuctl-sched` crate; `gpuctld simulate` is `gpuctl-sim`.

pub mod auth;
pub use gpuctl_core::config;
pub mod controller;
pub mod credentials;
pub mod daemon;
pub mod mail;
pub mod metrics;
pub mod pki;
pub mod raft;
pub mod server;
pub mod store;
pub mod web;
