//! `sbatch` and `scancel` as Slurm's tools.
//!
//! `sbatch [OPTIONS] [SCRIPT]`: the script's `#SBATCH` lines, then the command line's
//! options over them (the same parser: every option gpuctl reads in a script, it reads
//! here); no script named reads it from standard input; `--wrap CMD`. Prints
//! `Submitted batch job N`, or `N` with `--parsable`.
//!
//! `scancel [JOB...] [-u USER] [--me] [-n NAME] [-t STATE] [-p PART] [-A ACCT]
//! [-s SIG]`: silent on success, as scancel is; a job already finished is not an error.

use std::ffi::OsString;
use std::io::Read as _;

use clap::Parser as _;

use super::clap_failure;
use crate::cli::{Cli, Failure, exit, fail, print};

pub async fn sbatch(args: Vec<OsString>) -> Result<u8, Failure> {
    let args: Vec<String> = args
        .into_iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cmd = split(&args)?;
    if cmd.help {
        print(
            "Usage: sbatch [OPTIONS] [SCRIPT]\n  The options of #SBATCH lines (gpuctl help submit, docs/jobfile.md), --parsable, --wrap CMD.\n  No SCRIPT: the script is read from standard input.\n",
        );
        return Ok(exit::OK);
    }
    let (label, text) = match (&cmd.wrap, &cmd.script) {
        (Some(w), _) => ("wrap".to_string(), format!("#!/bin/sh\n{w}\n")),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| fail(format!("Unable to open file {path}: {e}")))?;
            (path.clone(), text)
        }
        (None, None) => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| fail(format!("cannot read the script from standard input: {e}")))?;
            ("(stdin)".to_string(), text)
        }
    };
    if !text.starts_with("#!") {
        return Err(fail(
            "This does not look like a batch script. The first line must start with #! followed by the path to an interpreter.\nFor instance: #!/bin/sh",
        ));
    }
    if !cmd.script_args.is_empty() {
        return Err(fail(format!(
            "arguments after the script ({}) are not passed to it by gpuctl: put them in the script, or use --wrap \"script args\"",
            cmd.script_args.join(" ")
        )));
    }
    let (mut job, extra) =
        crate::sbatch::parse_with(&label, &text, &cmd.options).map_err(|e| fail(e.to_string()))?;
    if cmd.wrap.is_some()
        && !cmd
            .options
            .iter()
            .any(|o| o.starts_with("-J") || o.starts_with("--job-name"))
    {
        job.spec.name = "wrap".into();
    }
    let cwd = std::env::current_dir()
        .map_err(|e| fail(format!("cannot read the current directory: {e}")))?;
    let submit = crate::submit::SubmitArgs::default();
    let hold = extra.hold;
    let spec = submit
        .spec(&label, job, extra, &cwd)
        .and_then(|r| r)
        .map_err(fail)?;
    let cli = Cli::parse_from(["gpuctl", "whoami"]);
    let mut client = crate::cli::connect(&cli).await?;
    let done = crate::commands::submit::run(&cli, &mut client, &label, spec, hold).await?;
    if cmd.parsable {
        print(&format!("{}\n", done.job_id));
    } else {
        print(&format!("Submitted batch job {}\n", done.job_id));
    }
    Ok(exit::OK)
}

/// sbatch's command line: its own options, the script and the script's arguments,
/// and the options the script parser reads.
#[derive(Debug, Default, PartialEq)]
struct Command {
    parsable: bool,
    help: bool,
    wrap: Option<String>,
    script: Option<String>,
    script_args: Vec<String>,
    /// `#SBATCH` options, as words.
    options: Vec<String>,
}

/// Options of sbatch's that take a value (the script parser knows the rest).
fn takes_value(word: &str) -> bool {
    const FLAGS: &[&str] = &[
        "--requeue",
        "--no-requeue",
        "--exclusive",
        "--hold",
        "-H",
        "--oversubscribe",
        "-s",
        "--get-user-env",
        "--kill-on-bad-exit",
        "-K",
        "--unbuffered",
        "-u",
        "--quiet",
        "-Q",
        "--verbose",
        "-v",
    ];
    if word.contains('=') || FLAGS.contains(&word) {
        return false;
    }
    // A short option with its value attached (`-t10`, `-J name` is two words).
    if !word.starts_with("--") && word.chars().count() > 2 {
        return false;
    }
    true
}

fn split(args: &[String]) -> Result<Command, Failure> {
    let mut c = Command::default();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        match a {
            "--parsable" => c.parsable = true,
            "--help" | "-h" => c.help = true,
            // Said nothing by sbatch but its result; accepted.
            "--quiet" | "-Q" | "--verbose" | "-v" => {}
            "--" => {
                c.script = args.get(i + 1).cloned();
                c.script_args = args.iter().skip(i + 2).cloned().collect();
                return Ok(c);
            }
            "--wrap" => {
                i += 1;
                c.wrap = Some(
                    args.get(i)
                        .cloned()
                        .ok_or_else(|| fail("--wrap needs a command"))?,
                );
            }
            w if w.starts_with("--wrap=") => c.wrap = Some(w["--wrap=".len()..].to_string()),
            w if w.starts_with('-') && w.len() > 1 => {
                c.options.push(w.to_string());
                if takes_value(w) {
                    i += 1;
                    let v = args
                        .get(i)
                        .ok_or_else(|| fail(format!("option {w} needs a value")))?;
                    c.options.push(v.clone());
                }
            }
            script => {
                c.script = Some(script.to_string());
                c.script_args = args[i + 1..].to_vec();
                return Ok(c);
            }
        }
        i += 1;
    }
    Ok(c)
}

#[derive(clap::Parser, Debug)]
#[command(name = "scancel")]
struct Scancel {
    #[command(flatten)]
    cancel: crate::commands::cancel::CancelArgs,
    /// The signal: KILL, TERM, INT (and 9, 15, 2) cancel (TERM, then KILL after the
    /// grace); any other (USR1, USR2, HUP, CONT, QUIT, URG, or 1, 3, 10, 12, 18) is sent to
    /// the running jobs, which run on.
    #[arg(short = 's', long = "signal")]
    signal: Option<String>,
    /// Accepted: scancel says nothing on success anyway.
    #[arg(short = 'Q', long = "quiet")]
    _quiet: bool,
    /// Accepted: the batch step and its children are the job here.
    #[arg(short = 'b', long = "batch")]
    _batch: bool,
    /// Accepted: every step of the job is signalled with it.
    #[arg(short = 'f', long = "full")]
    _full: bool,
    /// Accepted.
    #[arg(short = 'v', long = "verbose")]
    _verbose: bool,
}

pub async fn scancel(args: Vec<OsString>) -> Result<u8, Failure> {
    let s = Scancel::try_parse_from(args).map_err(clap_failure)?;
    let signal = match s.signal.as_deref().map(signal_name) {
        None | Some("KILL" | "TERM" | "INT") => None,
        Some(name) => Some(name),
    };
    let mut client = super::client().await?;
    let view = crate::commands::cancel::run(&mut client, &s.cancel, signal).await?;
    // scancel prints nothing on success; refusals go to stderr (view.failure).
    match view.failure() {
        Some(f) => Err(f),
        None => Ok(exit::OK),
    }
}

/// A signal as scancel takes it (`USR1`, `SIGUSR1`, `usr1`, `10`) by its name without
/// `SIG`; a number Linux gives no name here stays as given (the controller refuses it).
fn signal_name(sig: &str) -> &str {
    let upper = sig.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    const NAMES: &[(&str, &str)] = &[
        ("1", "HUP"),
        ("2", "INT"),
        ("3", "QUIT"),
        ("9", "KILL"),
        ("10", "USR1"),
        ("12", "USR2"),
        ("15", "TERM"),
        ("18", "CONT"),
        ("23", "URG"),
    ];
    let known = [
        "HUP", "INT", "QUIT", "KILL", "USR1", "USR2", "TERM", "CONT", "URG",
    ];
    if let Some((_, name)) = NAMES.iter().find(|(n, _)| *n == bare) {
        return name;
    }
    known.iter().find(|k| **k == bare).copied().unwrap_or(sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scancel_signals_are_read_by_name_or_number() {
        for (given, name) in [
            ("USR1", "USR1"),
            ("SIGusr2", "USR2"),
            ("10", "USR1"),
            ("SIG15", "TERM"),
            ("hup", "HUP"),
            ("9", "KILL"),
            ("WINCH", "WINCH"),
        ] {
            assert_eq!(signal_name(given), name, "{given}");
        }
    }

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn sbatch_command_lines_split_as_sbatch_reads_them() {
        let c = split(&words(
            "--parsable -J train -t 10 --gres=gpu:2 --exclusive job.sh",
        ))
        .unwrap();
        assert!(c.parsable);
        assert_eq!(c.script.as_deref(), Some("job.sh"));
        assert_eq!(c.options, words("-J train -t 10 --gres=gpu:2 --exclusive"));
        // Options after the script are the script's arguments.
        let c = split(&words("-N 2 run.sh --epochs 3")).unwrap();
        assert_eq!(c.script_args, words("--epochs 3"));
        // No script: standard input.
        let c = split(&words("-p gpu --wckey=x")).unwrap();
        assert_eq!(c.script, None);
        let c = split(&["--wrap".into(), "python train.py".into(), "-t5".into()]).unwrap();
        assert_eq!(c.wrap.as_deref(), Some("python train.py"));
        assert_eq!(c.options, words("-t5"));
        assert!(split(&words("-J")).is_err(), "a value is missing");
    }
}
