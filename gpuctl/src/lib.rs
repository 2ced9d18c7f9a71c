//! gpuctl, the command-line client.
//!
//! Modules:
//! - `jobfile`: the job file (`job.toml`): parsing with file/line/column errors,
//!   validation, conversion to the wire `JobSpec`.
//! - `sbatch`: Slurm batch scripts (`#SBATCH` lines) read as job files.
//! - `submit`: `gpuctl submit`'s arguments (file, `--wrap`, overriding options) to the
//!   wire `JobSpec`.
//! - `format`: JSON objects and tables for jobs and nodes.
//! - `pretty`: serde_json's pretty layout in fewer writes (every JSON output).
//! - `json_pages`: `queue --json` of a large queue, its pages decoded and written on
//!   worker threads.
//! - `cli`: the clap command line, the connection, and dispatch to `commands`.
//! - `commands`: one module per subcommand that talks to the controller, each returning
//!   a typed view (its JSON and its text).
//! - `slurm`: the tools that drive Slurm (`sbatch`, `squeue`, `sacct`, `scancel`,
//!   `sinfo`, `scontrol`, `sshare`, `sprio`) by the name gpuctl is called with, in
//!   their options and output formats.

pub mod cli;
pub mod commands;
pub mod format;
pub mod jobfile;
pub mod json_pages;
pub mod pretty;
pub mod sbatch;
pub mod slurm;
pub mod submit;
