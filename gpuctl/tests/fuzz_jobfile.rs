//! Bounded fuzzing of the job file parser: every file in `fuzz/corpus/jobfile` and
//! byte-level mutations of them (flips, inserts, deletions, splices) must parse or fail
//! with an error naming the file, never panic. CI runs the default case count; set
//! PROPTEST_CASES for a longer run.

use std::path::{Path, PathBuf};

use proptest::prelude::*;

fn corpus() -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/jobfile");
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect();
    v.sort();
    assert!(v.len() >= 8, "corpus went missing");
    v
}

/// Parses and, when that works, builds the spec: the whole client-side path.
fn exercise(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    match gpuctl::jobfile::parse("fuzz.toml", &text) {
        Ok(job) => {
            let _ = job.into_spec(Path::new("/home/u"), "u", 1000, 1000);
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("fuzz.toml"),
                "error without the file: {msg}"
            );
        }
    }
}

#[test]
fn corpus_files_parse_or_fail_cleanly() {
    for (path, bytes) in corpus() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = String::from_utf8_lossy(&bytes);
        let result = gpuctl::jobfile::parse(&name, &text);
        // Seeds 01-04 are valid job files; 05-08 are each refused.
        let valid = name.as_str() < "05";
        assert_eq!(result.is_ok(), valid, "{name}: {:?}", result.err());
        if let Err(e) = result {
            let msg = e.to_string();
            assert!(msg.contains(&format!("{name}:")), "{msg}");
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    /// Copy a slice of another seed in.
    Splice(usize, usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Delete),
        (any::<usize>(), any::<usize>(), any::<usize>())
            .prop_map(|(s, a, b)| Mutation::Splice(s, a, b)),
    ]
}

fn mutate(seed: &[u8], others: &[Vec<u8>], ms: &[Mutation]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for m in ms {
        let n = b.len().max(1);
        match *m {
            Mutation::Flip(i, x) if !b.is_empty() => b[i % n] ^= x,
            Mutation::Insert(i, x) => b.insert(i % (b.len() + 1), x),
            Mutation::Delete(i) if !b.is_empty() => {
                b.remove(i % n);
            }
            Mutation::Splice(s, from, len) => {
                let o = &others[s % others.len()];
                if !o.is_empty() {
                    let from = from % o.len();
                    let to = (from + len % 64).min(o.len());
                    let at = from.min(b.len());
                    b.splice(at..at, o[from..to].iter().copied());
                }
            }
            _ => {}
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn mutated_corpus_never_panics(
        seed in any::<usize>(),
        ms in proptest::collection::vec(mutation(), 1..12),
    ) {
        let corpus: Vec<Vec<u8>> = corpus().into_iter().map(|(_, b)| b).collect();
        let input = mutate(&corpus[seed % corpus.len()], &corpus, &ms);
        exercise(&input);
    }
}
