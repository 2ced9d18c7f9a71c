//! The house's rooms stay livable, checked rather than promised: no source file of the
//! workspace over 1,000 lines. (No function over 150 lines is clippy's `too_many_lines`,
//! set in clippy.toml and denied with the other warnings.)

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 1_000;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if p.is_dir() {
            if name != "target" && !name.starts_with('.') {
                sources(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_source_file_is_over_a_thousand_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > 100,
        "the walk found only {} files from {}",
        files.len(),
        root.display()
    );
    let over: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).ok()?.lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(over.is_empty(), "over {MAX_LINES} lines: {over:?}");
}
