//! The tools that drive Slurm, unchanged: gpuctl answers to `sbatch`, `squeue`,
//! `scancel`, `sacct`, `sinfo`, `scontrol`, `sshare` and `sprio` by the name it is
//! called with (besides `srun` and `salloc`, which are `gpuctl run` and `alloc`), with
//! their common options and the output formats workflow engines and executors parse
//! (`Submitted batch job N`, `squeue -h -o '%i %t'`, `sacct -P -o JobID,State`, ...).
//! `gpuctl slurm-links DIR` makes the links; the Debian package installs them through
//! alternatives, beside a real Slurm.
//!
//! Each tool reads the same listings as gpuctl's own commands; only the words differ:
//! states as Slurm writes them (`PENDING`/`PD`, `CANCELLED by UID`, `OUT_OF_MEMORY`),
//! times in this machine's zone without one, durations as `[D-]HH:MM:SS`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::Parser as _;
use gpuctl_proto as pb;

use crate::cli::{Cli, Client, Failure, connect, exit, fail, print};

mod sacct;
mod scontrol;
mod sinfo;
mod squeue;
mod submit;

/// The names gpuctl answers to as a Slurm tool (`srun` and `salloc` included).
pub const TOOLS: &[&str] = &[
    "sbatch", "squeue", "scancel", "sacct", "sinfo", "scontrol", "sshare", "sprio", "sacctmgr",
    "srun", "salloc",
];

/// The Slurm tool `argv0` names, if any.
pub fn tool_of(argv0: &std::ffi::OsStr) -> Option<&'static str> {
    let name = Path::new(argv0).file_name()?.to_str()?;
    TOOLS.iter().copied().find(|t| *t == name)
}

/// Runs Slurm tool `tool` with `args` (its own name first); answers the exit code.
pub async fn main(tool: &str, args: Vec<OsString>) -> u8 {
    let out = match tool {
        "sbatch" => submit::sbatch(args).await,
        "scancel" => submit::scancel(args).await,
        "squeue" => squeue::run(args).await,
        "sacct" => sacct::run(args).await,
        "sinfo" => sinfo::run(args).await,
        "scontrol" => scontrol::run(args).await,
        "sshare" => sshare(args).await,
        "sacctmgr" => sacctmgr(args).await,
        "sprio" => simple(args, "sprio").await,
        other => Err(fail(format!("{other} is not a tool gpuctl answers to"))),
    };
    match out {
        Ok(code) => code,
        Err(f) => {
            eprintln!("{tool}: error: {}", f.message);
            f.code
        }
    }
}

/// The accounts `user` may charge: those that list them, else their own name (the
/// controller's rule, `accounts.NAME.users`).
async fn accounts_of(client: &mut Client, user: &str) -> Result<Vec<String>, Failure> {
    let rows = client.share(pb::ShareRequest {}).await?.into_inner().rows;
    let mut mine: Vec<String> = rows
        .into_iter()
        .filter(|r| r.user == user && !r.account.is_empty())
        .map(|r| r.account)
        .collect();
    mine.dedup();
    if mine.is_empty() {
        mine.push(user.to_string());
    }
    Ok(mine)
}

/// `sshare`: gpuctl's share table; `sshare -U --format Account --noheader` (what tools
/// ask to learn a user's accounts): the caller's accounts, one a line.
async fn sshare(args: Vec<OsString>) -> Result<u8, Failure> {
    let words: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let only_me = words.iter().any(|w| w == "-U" || w == "--Users");
    let format = words
        .iter()
        .position(|w| w == "--format" || w == "-o")
        .and_then(|i| words.get(i + 1).cloned())
        .or_else(|| {
            words
                .iter()
                .find_map(|w| w.strip_prefix("--format=").map(str::to_string))
        });
    let account_only = format.is_some_and(|f| f.to_ascii_lowercase().starts_with("account"));
    if !(only_me && account_only) {
        return simple(args, "sshare").await;
    }
    let mut c = client().await?;
    let me = crate::commands::whoami::run(&mut c).await?.user;
    let accounts = accounts_of(&mut c, &me).await?;
    print_lines(&accounts);
    Ok(exit::OK)
}

/// Prints each of `lines` on a line of its own.
fn print_lines(lines: &[String]) {
    print(&lines.iter().map(|l| format!("{l}\n")).collect::<String>());
}

/// `sacctmgr list|show user NAME [format=account]` and `list account`: who may
/// charge what, read-only (gpuctl's accounts are its controller's config).
async fn sacctmgr(args: Vec<OsString>) -> Result<u8, Failure> {
    let words: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .filter(|w| !w.starts_with('-'))
        .collect();
    let lower: Vec<String> = words.iter().map(|w| w.to_ascii_lowercase()).collect();
    let verb_ok = matches!(lower.first().map(String::as_str), Some("list" | "show"));
    let mut c = client().await?;
    match lower.get(1).map(String::as_str) {
        Some("user" | "users") if verb_ok => {
            let user = match words.get(2).filter(|w| !w.contains('=')) {
                Some(u) => u.clone(),
                None => crate::commands::whoami::run(&mut c).await?.user,
            };
            let accounts = accounts_of(&mut c, &user).await?;
            print_lines(&accounts);
            Ok(exit::OK)
        }
        Some("account" | "accounts") if verb_ok => {
            let rows = c.share(pb::ShareRequest {}).await?.into_inner().rows;
            let mut accounts: Vec<String> = rows.into_iter().map(|r| r.account).collect();
            accounts.sort();
            accounts.dedup();
            print_lines(&accounts);
            Ok(exit::OK)
        }
        _ => Err(fail(
            "gpuctl answers to: sacctmgr list user [NAME] [format=account], sacctmgr list account (accounts are the controller's config, changed there)",
        )),
    }
}

/// `sshare` and `sprio`: gpuctl's `share` and `priority` (their tables are theirs).
async fn simple(args: Vec<OsString>, tool: &str) -> Result<u8, Failure> {
    #[derive(clap::Parser)]
    struct Plain {
        /// JSON instead of the table.
        #[arg(long)]
        json: bool,
        /// Accepted as Slurm's tools take them; every row is shown.
        #[arg(short = 'a', long = "all")]
        _all: bool,
        #[arg(short = 'l', long = "long")]
        _long: bool,
    }
    let p = Plain::try_parse_from(args).map_err(clap_failure)?;
    let mut c = client().await?;
    match tool {
        "sshare" => crate::commands::emit(&crate::commands::share::run(&mut c).await?, p.json),
        _ => crate::commands::emit(&crate::commands::priority::run(&mut c).await?, p.json),
    }
    Ok(exit::OK)
}

/// A client as gpuctl's own commands make one (GPUCTL_CONTROLLER, GPUCTL_CA, ...).
async fn client() -> Result<Client, Failure> {
    let cli = Cli::parse_from(["gpuctl", "whoami"]);
    connect(&cli).await
}

/// A usage error as Slurm's tools exit with it (help and version are not errors).
fn clap_failure(e: clap::Error) -> Failure {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        std::process::exit(0);
    }
    Failure {
        code: exit::USAGE,
        message: e.to_string().trim_end().to_string(),
    }
}

/// Makes a link to this gpuctl for each Slurm tool in `dir` (an existing entry that
/// is not such a link is left, and said so).
pub fn links(dir: &Path) -> Result<Vec<PathBuf>, Failure> {
    let me = std::env::current_exe()
        .map_err(|e| fail(format!("cannot find this gpuctl's path: {e}")))?;
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
    let mut made = Vec::new();
    for tool in TOOLS {
        let link = dir.join(tool);
        match std::fs::read_link(&link) {
            Ok(to) if to == me => {
                made.push(link);
                continue;
            }
            Ok(_) => {
                std::fs::remove_file(&link)
                    .map_err(|e| fail(format!("{}: {e}", link.display())))?;
            }
            Err(_) if link.exists() => {
                eprintln!(
                    "gpuctl: {} exists and is not a link: left as it is",
                    link.display()
                );
                continue;
            }
            Err(_) => {}
        }
        std::os::unix::fs::symlink(&me, &link)
            .map_err(|e| fail(format!("cannot link {}: {e}", link.display())))?;
        made.push(link);
    }
    Ok(made)
}

/// A job state as Slurm writes it, long: PENDING, RUNNING, COMPLETED, CANCELLED,
/// FAILED, TIMEOUT, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY (a failure the reason says was
/// the memory limit).
pub fn state_long(j: &pb::Job) -> &'static str {
    use pb::JobState as S;
    match j.state() {
        S::Pending | S::Unspecified => "PENDING",
        S::Running => "RUNNING",
        S::Completed => "COMPLETED",
        S::Cancelled => "CANCELLED",
        S::Failed if oom(&j.reason) => "OUT_OF_MEMORY",
        S::Failed => "FAILED",
        S::Timeout => "TIMEOUT",
        S::NodeFail => "NODE_FAIL",
        S::Preempted => "PREEMPTED",
    }
}

/// The same, compact: PD, R, CD, CA, F, TO, NF, PR, OOM.
pub fn state_short(j: &pb::Job) -> &'static str {
    match state_long(j) {
        "PENDING" => "PD",
        "RUNNING" => "R",
        "COMPLETED" => "CD",
        "CANCELLED" => "CA",
        "FAILED" => "F",
        "TIMEOUT" => "TO",
        "NODE_FAIL" => "NF",
        "PREEMPTED" => "PR",
        _ => "OOM",
    }
}

fn oom(reason: &str) -> bool {
    let r = reason.to_ascii_lowercase();
    r.contains("out of memory") || r.contains("oom")
}

/// sacct's state: a cancel names who did it, by uid (`CANCELLED by 1001`).
pub fn state_with_actor(j: &pb::Job) -> String {
    let long = state_long(j);
    if long != "CANCELLED" {
        return long.to_string();
    }
    let who = j
        .reason
        .split_once("cancelled by ")
        .or_else(|| j.reason.split_once("cancelled while pending by "))
        .map(|(_, w)| w.split_whitespace().next().unwrap_or_default().to_string());
    let uid = who.and_then(|w| {
        nix::unistd::User::from_name(&w)
            .ok()
            .flatten()
            .map(|u| u.uid.as_raw())
    });
    match uid {
        Some(uid) => format!("CANCELLED by {uid}"),
        None => long.to_string(),
    }
}

/// sacct's ExitCode, `code:signal`: a job killed (cancelled, timed out) shows signal
/// 15 when no code was recorded.
pub fn exit_code(j: &pb::Job) -> String {
    match j.exit_code {
        Some(c) if c >= 0 => format!("{c}:0"),
        Some(c) => format!("0:{}", -c),
        None if matches!(state_long(j), "CANCELLED" | "TIMEOUT" | "PREEMPTED") => "0:15".into(),
        None => "0:0".into(),
    }
}

pub use gpuctl_core::text::hms;

/// A time limit as sacct writes it (`UNLIMITED` for none).
pub fn limit_hms(secs: u64) -> String {
    if secs == 0 {
        "UNLIMITED".into()
    } else {
        hms(i64::try_from(secs.min(1 << 40)).unwrap_or(0) * 1000)
    }
}

/// A time as Slurm's tools write it: this machine's zone, to the second, no zone;
/// `Unknown` for none.
pub fn time(ms: i64) -> String {
    if ms <= 0 {
        return "Unknown".into();
    }
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| {
            t.to_zoned(jiff::tz::TimeZone::system())
                .strftime("%Y-%m-%dT%H:%M:%S")
                .to_string()
        })
        .unwrap_or_else(|_| "Unknown".into())
}

/// Every job of `req`, page by page.
async fn jobs(client: &mut Client, req: pb::ListJobsRequest) -> Result<Vec<pb::Job>, Failure> {
    let mut pages = client.list_jobs_paged(req).await?.into_inner();
    let mut out = Vec::new();
    while let Some(page) = pages.message().await? {
        out.extend(page.jobs);
    }
    Ok(out)
}

/// Fields `%[.][width]c` (squeue's and sinfo's `-o`): each one's letter, whether it is
/// right-justified and its width (0: as wide as it is), and the text between.
#[derive(Debug, PartialEq)]
pub enum Piece {
    Text(String),
    Field {
        code: char,
        right: bool,
        width: usize,
    },
}

/// Splits a `-o` format.
pub fn pieces(format: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            text.push('%');
            continue;
        }
        let right = chars.next_if_eq(&'.').is_some();
        // `%-10j`: left-justified, as without the dot.
        let _ = chars.next_if_eq(&'-');
        let mut width = 0usize;
        while let Some(d) = chars.next_if(char::is_ascii_digit) {
            width = width
                .saturating_mul(10)
                .saturating_add(d.to_digit(10).unwrap_or(0) as usize);
        }
        let Some(code) = chars.next() else { break };
        if !text.is_empty() {
            out.push(Piece::Text(std::mem::take(&mut text)));
        }
        out.push(Piece::Field {
            code,
            right,
            width: width.min(1024),
        });
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    out
}

/// A value in a field of `width` (cut to it, as squeue does; padded), left or right.
pub fn fit(value: &str, right: bool, width: usize) -> String {
    if width == 0 {
        return value.to_string();
    }
    let cut: String = value.chars().take(width).collect();
    if right {
        format!("{cut:>width$}")
    } else {
        format!("{cut:<width$}")
    }
}

/// Renders one line of `pieces` with `value` giving each field's text; `header`
/// gives the column names instead.
pub fn render(pieces: &[Piece], value: impl Fn(char) -> String) -> String {
    let mut line = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => line.push_str(t),
            Piece::Field { code, right, width } => {
                line.push_str(&fit(&value(*code), *right, *width));
            }
        }
    }
    line.trim_end().to_string()
}

#[cfg(test)]
mod golden;
#[cfg(test)]
mod tests;
