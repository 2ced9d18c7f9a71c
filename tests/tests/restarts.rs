//! `max_restarts` on the real binaries: a job that fails is queued again (same id, its
//! output appended after a line marking the attempt) and completes on its second start; one that keeps failing ends
//! FAILED once its restarts are spent.

use std::time::Duration;

use gpuctl_tests::Cluster;

const T: Duration = Duration::from_secs(40);

#[test]
fn a_failing_job_restarts_until_it_succeeds_or_its_restarts_are_spent() {
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let flaky = c.submit(
        "flaky.toml",
        "name = \"flaky\"\nmax_restarts = 2\nstdout = \"out-%j.txt\"\n\
         script = \"if [ -e marker ]; then echo second; else touch marker; echo first; exit 3; fi\"\n\
         [resources]\ngpus = 1\n",
    );
    let done = c.wait_state(flaky, "COMPLETED", T);
    assert_eq!(done["attempt"], 2, "{done:#}");
    assert_eq!(
        (&done["restarts"], &done["max_restarts"]),
        (&serde_json::json!(1), &serde_json::json!(2)),
        "{done:#}"
    );
    let out = std::fs::read_to_string(c.path(&format!("out-{flaky}.txt"))).unwrap();
    assert!(
        out.starts_with("first\n") && out.ends_with("second\n"),
        "both attempts' output: {out:?}"
    );
    // The second attempt's part opens with a line saying so (sbatch --open-mode=append
    // keeps the first's; this marks where each later one begins).
    let marks: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("--- gpuctl:"))
        .collect();
    assert_eq!(marks.len(), 1, "{out:?}");
    assert!(
        marks[0].starts_with(&format!("--- gpuctl: job {flaky}, attempt 2, on n1, ")),
        "{out:?}"
    );

    let broken = c.submit(
        "broken.toml",
        "name = \"broken\"\nmax_restarts = 1\nscript = \"exit 7\"\n[resources]\ngpus = 1\n",
    );
    let failed = c.wait_state(broken, "FAILED", T);
    assert_eq!(
        failed["attempt"], 2,
        "one restart, then no more: {failed:#}"
    );
    assert_eq!(failed["exit_code"], 7, "{failed:#}");
}
