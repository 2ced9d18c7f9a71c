//! gpuctl-base: what the controller's state machine (`gpuctl-core`), the wire
//! (`gpuctl-proto`) and the node agent (`gpud`) all speak, kept below them so that the
//! agent links neither the state machine nor its conversions: text helpers (`text`),
//! the signals a job may name (`signal`), a step's name rules (`step`), and an agent
//! session's anti-replay window (`replay`). Pure: no dependencies, no I/O.

pub mod replay;
pub mod signal;
pub mod step;
pub mod text;
