//! Several controller addresses (`--controller a,b,c`, `GPUCTL_CONTROLLER`): `gpuctl`
//! tries them in order and uses the first that answers; one that cannot be reached is
//! passed over, and when none answers the error names each. (Issue 40's clients: with
//! one controller today, the list is where it may be reached.)

use std::process::{Command, Output};

use gpuctl_tests::{Cluster, bin};

fn gpuctl_with(c: &Cluster, controllers: &str, args: &[&str]) -> Output {
    Command::new(bin("gpuctl"))
        .args(args)
        .env("GPUCTL_CONTROLLER", controllers)
        .current_dir(c.path("."))
        .output()
        .expect("run gpuctl")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_first_controller_that_answers_is_used_and_none_answering_names_each() {
    let c = Cluster::start(&[]);
    let dead = format!("unix:{}", c.path("nobody-here.sock").display());
    let gone = format!("unix:{}", c.path("gone.sock").display());

    // A dead address first, then the controller (with a space after the comma).
    let list = format!("{dead}, {}", c.url());
    let out = gpuctl_with(&c, &list, &["whoami"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
    // The controller first: the dead one after it is never tried.
    let out = gpuctl_with(&c, &format!("{},{dead}", c.url()), &["queue"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // None answers: exit 3 (unreachable), each address with its own reason.
    let out = gpuctl_with(&c, &format!("{dead},{gone}"), &["queue"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("no controller of"), "{err}");
    assert!(
        err.contains("nobody-here.sock") && err.contains("gone.sock"),
        "{err}"
    );

    // A list with an empty place or an unknown scheme is a usage error, whatever else
    // it names: nothing is tried.
    for bad in [
        format!("{},,{dead}", c.url()),
        format!("{},ftp://x", c.url()),
    ] {
        let out = gpuctl_with(&c, &bad, &["queue"]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
    }
}
