use super::*;

fn job(state: pb::JobState, reason: &str, exit: Option<i32>) -> pb::Job {
    pb::Job {
        id: 7,
        state: state as i32,
        reason: reason.into(),
        exit_code: exit,
        ..pb::Job::default()
    }
}

#[test]
fn states_as_slurm_writes_them() {
    use pb::JobState as S;
    let cases = [
        (S::Pending, "", "PENDING", "PD"),
        (S::Running, "", "RUNNING", "R"),
        (S::Completed, "", "COMPLETED", "CD"),
        (S::Cancelled, "", "CANCELLED", "CA"),
        (S::Failed, "exit 1", "FAILED", "F"),
        (
            S::Failed,
            "killed: out of memory (cgroup)",
            "OUT_OF_MEMORY",
            "OOM",
        ),
        (S::Timeout, "", "TIMEOUT", "TO"),
        (S::NodeFail, "", "NODE_FAIL", "NF"),
        (S::Preempted, "", "PREEMPTED", "PR"),
    ];
    for (s, reason, long, short) in cases {
        let j = job(s, reason, None);
        assert_eq!((state_long(&j), state_short(&j)), (long, short), "{s:?}");
    }
    // A cancel by root names uid 0, as sacct does.
    let j = job(S::Cancelled, "cancelled by root", None);
    assert_eq!(state_with_actor(&j), "CANCELLED by 0");
    assert_eq!(state_with_actor(&job(S::Cancelled, "", None)), "CANCELLED");
}

#[test]
fn exit_codes_and_durations_as_sacct_writes_them() {
    use pb::JobState as S;
    assert_eq!(exit_code(&job(S::Completed, "", Some(0))), "0:0");
    assert_eq!(exit_code(&job(S::Failed, "", Some(3))), "3:0");
    assert_eq!(exit_code(&job(S::Failed, "", Some(-9))), "0:9");
    assert_eq!(exit_code(&job(S::Cancelled, "", None)), "0:15");
    assert_eq!(hms(5_000), "00:00:05");
    assert_eq!(hms(3_723_000), "01:02:03");
    assert_eq!(hms(90_061_000), "1-01:01:01");
    assert_eq!(limit_hms(0), "UNLIMITED");
    assert_eq!(limit_hms(300), "00:05:00");
    assert_eq!(time(0), "Unknown");
    assert_eq!(time(1_700_000_000_000).len(), "2023-11-14T22:13:20".len());
}

#[test]
fn formats_split_and_fields_fit_as_squeue_cuts_them() {
    let p = pieces("%.18i %.9P %-8j|%u %%x %t");
    assert_eq!(
        p[0],
        Piece::Field {
            code: 'i',
            right: true,
            width: 18
        }
    );
    assert_eq!(p[1], Piece::Text(" ".into()));
    let line = render(&p, |c| match c {
        'i' => "42".into(),
        'P' => "gpu".into(),
        'j' => "a-very-long-name".into(),
        'u' => "ann".into(),
        't' => "R".into(),
        _ => "?".into(),
    });
    assert_eq!(line, format!("{:>18} {:>9} a-very-l|ann %x R", "42", "gpu"));
    assert_eq!(fit("abc", false, 0), "abc");
    assert_eq!(fit("abcdef", true, 3), "abc");
    assert_eq!(fit("ab", true, 4), "  ab");
}

#[test]
fn tools_are_known_by_their_names() {
    assert_eq!(
        tool_of(std::ffi::OsStr::new("/usr/bin/sbatch")),
        Some("sbatch")
    );
    assert_eq!(tool_of(std::ffi::OsStr::new("squeue")), Some("squeue"));
    assert_eq!(tool_of(std::ffi::OsStr::new("gpuctl")), None);
    let dir = tempfile::tempdir().unwrap();
    // A file of the same name that is not a link (a real Slurm's) is left as it is.
    std::fs::write(dir.path().join("sinfo"), "a real sinfo").unwrap();
    let made = links(dir.path()).unwrap();
    assert_eq!(made.len(), TOOLS.len() - 1);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("sinfo")).unwrap(),
        "a real sinfo"
    );
    let me = std::env::current_exe().unwrap();
    assert_eq!(std::fs::read_link(dir.path().join("sbatch")).unwrap(), me);
    // Again: the same links.
    assert_eq!(links(dir.path()).unwrap().len(), TOOLS.len() - 1);
}

#[test]
fn node_names_fold_into_hostlists() {
    let names = ["gpu01", "gpu02", "gpu03", "gpu07", "login", "gpu10"];
    assert_eq!(
        sinfo::hostlist(names.iter().copied()),
        "gpu[01-03,07,10],login"
    );
    assert_eq!(sinfo::hostlist(["n1"].iter().copied()), "n1");
}
