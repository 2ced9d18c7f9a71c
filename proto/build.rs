fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Use the vendored protoc so that no system protoc is needed.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        // Small starting buffers: every open stream keeps its own (src/codec.rs).
        .codec_path("crate::codec::Codec")
        .compile_protos(&["proto/gpuctl.proto", "proto/store.proto"], &["proto"])?;
    Ok(())
}
