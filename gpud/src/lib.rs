//! gpud, the gpuctl node agent.
//!
//! Modules:
//! - `devices`, `devices_bpf`: GPU device isolation in a job's cgroup (v1 `devices`
//!   entries, a cgroup2 eBPF device program), from the job's slots (pure rules).
//! - `gpu`: the `GpuBackend` trait with the NVML backend and the fake one (`gpu::fake`).
//! - `launch`: the environment and output paths a job gets (pure), and the `Launcher`
//!   trait that starts and signals job processes.
//! - `monitor`: GPU sampling mapped to jobs, GPU-memory share enforcement.
//! - `exporter`: the Prometheus endpoint (dcgm-exporter's counters, names and labels,
//!   MIG instances included).
//! - `mps`: the CUDA MPS control daemon per GPU for fractional shares.
//! - `reports`: job reports kept on disk until the controller acknowledges them.
//! - `agent`: registration, the command stream, heartbeats, job lifecycles.
//! - `forkserver`: `gpud __forkserver`, the small process that forks each job's shim
//!   (its cgroup, its user, its outputs) without the cost of forking the agent.
//! - `shim`: the job's top process that records how it ended, so that a restarted
//!   agent learns a job's real end.
//! - `health`: the site's health program (like Slurm's HealthCheckProgram).
//! - `host`: facts about this machine (CPUs, memory, hostname).
//! - `procfs`: facts about processes from /proc (process group, start time).
//!
//! Module dependencies go one way: `gpu` and `launch` use `procfs`; `monitor` and
//! `exporter` use `gpu`; `agent` uses them all.

pub mod agent;
pub mod cgroup;
pub mod devices;
pub mod devices_bpf;
pub mod exporter;
pub mod forkserver;
pub mod gpu;
pub mod health;
pub mod host;
pub mod identity;
pub mod launch;
pub mod monitor;
pub mod mps;
pub mod power;
pub mod procfs;
pub mod reports;
pub mod shim;
pub mod steps;
