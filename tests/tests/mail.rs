//! Mail about jobs on the real binaries (issue 57): a job submitted with
//! `--mail-type=BEGIN,END --mail-user=...` has the controller run `[mail] program`
//! as Slurm runs its MailProg (`-s SUBJECT RECIPIENT`) when it begins and when it
//! ends; a recipient that would read as an option is refused at submit.

use std::time::Duration;

use gpuctl_tests::{Cluster, wait_for};

#[test]
fn a_job_that_asks_for_mail_gets_slurms_began_and_ended_mails() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("mails.log");
    let program = dir.path().join("mail.sh");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\nprintf '%s|' \"$@\" >> {}\necho >> {}\n",
            log.display(),
            log.display()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("755")
        .arg(&program)
        .status()
        .unwrap();
    let mut c =
        Cluster::controller_with_config(&format!("[mail]\nprogram = \"{}\"\n", program.display()));
    c.add_agent("m1", "1xA100-80GB", &[]);
    c.wait_nodes_up(1);
    std::fs::write(
        c.path("job.sh"),
        "#!/bin/sh\n#SBATCH -J nightly --mail-type=begin,end --mail-user=team@example.com\ntrue\n",
    )
    .unwrap();
    let id = c.json(&["submit", c.path("job.sh").to_str().unwrap()])["job_id"]
        .as_u64()
        .unwrap();
    c.wait_state(id, "COMPLETED", Duration::from_secs(30));
    let mails = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_for(Duration::from_secs(10), || mails().lines().count() >= 2),
        "{}",
        mails()
    );
    let lines: Vec<String> = mails().lines().map(str::to_string).collect();
    assert!(
        lines[0].starts_with(&format!(
            "-s|Slurm Job_id={id} Name=nightly Began, Queued time 00:00:0"
        )) && lines[0].ends_with("|team@example.com|"),
        "{lines:?}"
    );
    assert!(
        lines[1].contains(&format!("Slurm Job_id={id} Name=nightly Ended, Run time "))
            && lines[1].contains(", COMPLETED, ExitCode 0|team@example.com|"),
        "{lines:?}"
    );
    // A recipient the program would read as an option: refused, with why.
    std::fs::write(
        c.path("bad.sh"),
        "#!/bin/sh\n#SBATCH --mail-type=END --mail-user=-oQ/tmp/x\ntrue\n",
    )
    .unwrap();
    let out = c.gpuctl(&["submit", c.path("bad.sh").to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("mail user"),
        "{out:?}"
    );
}
