//! gpuctl, the command-line client.
//!
//! Modules:
//! - `jobfile`: the job file (`job.toml`): parsing with file/line/column errors,
//!   validation, conversion to the wire `JobSpec`.
//! - `sbatch`: Slurm batch scripts (`#SBATCH` lines) read as job files.
//! - `submit`: `gpuctl submit`'s arguments (file, `--wrap`, overriding options) to the
//!   wire `JobSpec`.
//! - `format`: JSON objects and tables for jobs and nodes.
//! - `cli`: the clap command line and what each subcommand does.

pub mod cli;
pub mod format;
pub mod jobfile;
pub mod sbatch;
pub mod submit;
