//! The pure crates stay pure by their dependency trees, not by convention: neither the
//! scheduler nor the controller's state machine may reach an async runtime, a gRPC or
//! HTTP stack, the store or protobuf: core speaks its own types (`gpuctl_core::record`,
//! `event`, `command`, `node`, `view`), and `gpuctl-proto` converts at the edges.

use std::collections::BTreeSet;
use std::process::Command;

/// The packages in `package`'s normal (not build, not dev) dependency tree, resolved
/// as a build of that package alone resolves them.
fn tree(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["-f", "{p}", "-p", package])
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let names: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert!(
        names.contains(package),
        "{package} not in its own tree: {text}"
    );
    names
}

/// Crates that do I/O, run tasks or speak a network protocol.
const IMPURE: &[&str] = &[
    "tokio",
    "mio",
    "tonic",
    "hyper",
    "h2",
    "axum",
    "tower",
    "sled",
    "reqwest",
    "prometheus-client",
];

fn impure_in(package: &str) -> Vec<String> {
    tree(package)
        .into_iter()
        .filter(|n| IMPURE.contains(&n.as_str()))
        .collect()
}

#[test]
fn the_state_machine_has_no_runtime_no_rpc_stack_no_store_and_no_protobuf() {
    assert_eq!(impure_in("gpuctl-core"), Vec::<String>::new());
    let t = tree("gpuctl-core");
    assert!(!t.contains("prost") && !t.contains("gpuctl-proto"), "{t:?}");
}

#[test]
fn the_scheduler_has_no_runtime_no_rpc_stack_no_store_and_no_protobuf() {
    assert_eq!(impure_in("gpuctl-sched"), Vec::<String>::new());
    let t = tree("gpuctl-sched");
    assert!(!t.contains("prost") && !t.contains("gpuctl-proto"), "{t:?}");
}

#[test]
fn the_daemon_does_have_them() {
    // The check above can fail: the same query on the daemon finds the runtime.
    let t = tree("gpuctld");
    assert!(
        t.contains("tokio") && t.contains("tonic") && t.contains("sled") && t.contains("prost"),
        "{t:?}"
    );
}

#[test]
fn the_daemon_links_no_simulator() {
    // `gpuctld simulate` runs `gpuctl-sim`, the simulator's own binary: its plots,
    // progress bars and trace readers stay out of the daemon (issue 56).
    let t = tree("gpuctld");
    for c in ["gpuctl-sim", "plotters", "indicatif", "csv"] {
        assert!(!t.contains(c), "gpuctld links {c}");
    }
    // The check can fail: the simulator's own tree has them.
    let sim = tree("gpuctl-sim");
    assert!(
        sim.contains("plotters") && sim.contains("indicatif"),
        "{sim:?}"
    );
}

#[test]
fn the_cli_and_the_agent_link_no_planning_allocator() {
    // mimalloc and its start-up are for the processes that plan (gpuctl-alloc): in the
    // CLI they cost every command 0.1 ms before it did anything (measured, issue 56).
    for package in ["gpuctl", "gpud"] {
        let t = tree(package);
        assert!(
            !t.contains("libmimalloc-sys") && !t.contains("gpuctl-alloc"),
            "{package}: {t:?}"
        );
    }
    assert!(tree("gpuctld").contains("gpuctl-alloc"));
}

#[test]
fn the_agent_links_no_state_machine() {
    // The node agent speaks protobuf and the shared words (`gpuctl-base`); the
    // conversions to the state machine's types are gpuctl-proto's `core` feature, which
    // only the controller and the CLI take (issue 56).
    let t = tree("gpud");
    assert!(
        !t.contains("gpuctl-core") && t.contains("gpuctl-base") && t.contains("gpuctl-proto"),
        "{t:?}"
    );
    // The check can fail: the controller's tree has the state machine.
    assert!(tree("gpuctld").contains("gpuctl-core"));
    assert!(tree("gpuctl").contains("gpuctl-core"));
}

#[test]
fn the_shared_words_depend_on_nothing() {
    let t = tree("gpuctl-base");
    assert_eq!(t.into_iter().collect::<Vec<_>>(), ["gpuctl-base"]);
}
