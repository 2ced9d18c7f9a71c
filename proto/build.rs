use std::fmt::Write as _;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Use the vendored protoc so that no system protoc is needed.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out.join("descriptors.bin");
    // The services only with the `rpc` feature (the messages alone need prost only).
    let rpc = std::env::var_os("CARGO_FEATURE_RPC").is_some();
    tonic_prost_build::configure()
        .build_server(rpc)
        .build_client(rpc)
        .file_descriptor_set_path(&descriptors)
        // Small starting buffers: every open stream keeps its own (src/codec.rs).
        .codec_path("crate::codec::Codec")
        // A page of a listing the controller can fill with jobs it encoded itself
        // (src/pages.rs).
        .extern_path(
            ".gpuctl.v1.ListJobsResponse",
            "crate::pages::ListJobsResponse",
        )
        .compile_protos(&["proto/gpuctl.proto", "proto/store.proto"], &["proto"])?;
    std::fs::write(out.join("tags.rs"), tags(&std::fs::read(&descriptors)?)?)?;
    Ok(())
}

/// Every top-level message's field numbers as constants named as the fields, in a
/// module named as the message in snake case (`tags::job_spec::name`): the hand encoder
/// and the conversions take a field's number from here, so that it is written once, in
/// the .proto files.
fn tags(descriptors: &[u8]) -> Result<String, Box<dyn std::error::Error>> {
    use prost::Message as _;
    let set = prost_types::FileDescriptorSet::decode(descriptors)?;
    let mut code = String::new();
    let mut seen = std::collections::BTreeSet::new();
    for file in &set.file {
        for m in &file.message_type {
            let module = snake(m.name());
            if !seen.insert(module.clone()) {
                return Err(format!("two messages named {module} in the .proto files").into());
            }
            writeln!(code, "pub mod {module} {{")?;
            for f in &m.field {
                let name = f.name();
                let raw = if KEYWORDS.contains(&name) { "r#" } else { "" };
                writeln!(code, "    pub const {raw}{name}: u32 = {};", f.number())?;
            }
            writeln!(code, "}}")?;
        }
    }
    Ok(code)
}

/// Field names that must be written raw (`r#type`) as Rust names.
const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern",
    "false", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut",
    "pub", "ref", "return", "static", "struct", "trait", "true", "type", "unsafe", "use", "where",
    "while",
];

/// `JobSpec` -> `job_spec`, `GpuMetrics` -> `gpu_metrics`.
fn snake(name: &str) -> String {
    let mut out = String::new();
    let chars: Vec<char> = name.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() {
            let after_lower = i > 0 && !chars[i - 1].is_ascii_uppercase();
            let ends_acronym = i > 0
                && chars[i - 1].is_ascii_uppercase()
                && chars.get(i + 1).is_some_and(char::is_ascii_lowercase);
            if after_lower || ends_acronym {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}
