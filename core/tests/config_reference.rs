//! The configuration reference stays true: `deploy/gpuctld.toml` loads, sets exactly
//! the defaults, and names every key the controller has; the example in
//! docs/operations.md loads too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use gpuctl_core::config::Config;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// Every key path of a TOML document (`health.max_gpu_temp_c`), tables included.
fn keys(v: &toml::Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let toml::Value::Table(t) = v {
        for (k, v) in t {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            keys(v, &path, out);
            out.insert(path);
        }
    }
}

#[test]
fn the_reference_config_is_the_defaults_and_names_every_key() {
    let path = repo("deploy/gpuctld.toml");
    let loaded = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let defaults = Config::default();
    assert_eq!(
        loaded.to_toml(),
        defaults.to_toml(),
        "deploy/gpuctld.toml must set the defaults"
    );
    let mut documented = BTreeSet::new();
    let text = std::fs::read_to_string(&path).unwrap();
    keys(&toml::from_str(&text).unwrap(), "", &mut documented);
    let mut all = BTreeSet::new();
    keys(&toml::from_str(&defaults.to_toml()).unwrap(), "", &mut all);
    let missing: Vec<&String> = all.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "keys of the config missing in deploy/gpuctld.toml: {missing:?}"
    );
    // Keys that are off by default are there as comments.
    for key in [
        "# max_time_limit",
        "# reservation_depth",
        "# after",
        "# [accounts.",
        "# [partitions.",
        "# [windows.",
    ] {
        assert!(text.contains(key), "{key} not shown");
    }
}

#[test]
fn the_operations_guide_example_config_loads() {
    let guide = std::fs::read_to_string(repo("docs/operations.md")).unwrap();
    let start = guide
        .find("```toml\ndefault_time_limit")
        .expect("the example")
        + 8;
    let end = start + guide[start..].find("```").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("example.toml");
    std::fs::write(&file, &guide[start..end]).unwrap();
    let c = Config::load(&file).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.timezone, "Europe/London");
    assert!(c.windows.contains_key("business"));
    assert!(c.partitions.contains_key("inference"));
}

#[test]
fn the_config_reference_page_holds_the_file() {
    let page = std::fs::read_to_string(repo("docs/config.md")).unwrap();
    let file = std::fs::read_to_string(repo("deploy/gpuctld.toml")).unwrap();
    assert!(
        page.contains(&format!("```toml\n{file}```\n")),
        "docs/config.md's copy of deploy/gpuctld.toml differs"
    );
}
