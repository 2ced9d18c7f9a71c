//! Sends the mails the state machine says are due (`gpuctl_core::mail`) through the
//! `[mail] program` of the controller's config, as Slurm's MailProg is run: `PROGRAM -s
//! SUBJECT RECIPIENT` with an empty body (`mail`/`mailx`, or a site's script). The
//! recipient was checked at submit (a name or an address, never an option); the
//! program runs as the controller, never through a shell. At most four at once, each
//! given 30 s; past 1,000 waiting (a user's flood of jobs with mail), more are dropped
//! with a line in the log rather than queued without end.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gpuctl_core::mail::Mail;

static WAITING: AtomicUsize = AtomicUsize::new(0);
static RUNNING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);
const MAX_WAITING: usize = 1_000;

/// Starts sending `mails` with `program` (empty: mail is not configured; none sent).
pub fn send(program: &str, mails: Vec<Mail>) {
    if program.is_empty() || mails.is_empty() {
        return;
    }
    for m in mails {
        if WAITING.fetch_add(1, Ordering::SeqCst) >= MAX_WAITING {
            WAITING.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(to = %m.to, subject = %m.subject, "mail dropped: {MAX_WAITING} are waiting to be sent");
            continue;
        }
        let program = program.to_string();
        tokio::spawn(async move {
            let _permit = RUNNING.acquire().await;
            let child = tokio::process::Command::new(&program)
                .arg("-s")
                .arg(&m.subject)
                .arg(&m.to)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn();
            let done = match child {
                Ok(mut c) => tokio::time::timeout(Duration::from_secs(30), c.wait()).await,
                Err(e) => Ok(Err(e)),
            };
            match done {
                Ok(Ok(s)) if s.success() => tracing::debug!(to = %m.to, "mail sent"),
                Ok(Ok(s)) => tracing::warn!(to = %m.to, %program, "mail program exited with {s}"),
                Ok(Err(e)) => {
                    tracing::warn!(to = %m.to, %program, "cannot run the mail program: {e}")
                }
                Err(_) => tracing::warn!(to = %m.to, %program, "mail program killed after 30 s"),
            }
            WAITING.fetch_sub(1, Ordering::SeqCst);
        });
    }
}
