fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Use the vendored protoc so that no system protoc is needed.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto");
    // The services only with the `rpc` feature (the messages alone need prost only).
    let rpc = std::env::var_os("CARGO_FEATURE_RPC").is_some();
    tonic_prost_build::configure()
        .build_server(rpc)
        .build_client(rpc)
        // Small starting buffers: every open stream keeps its own (src/codec.rs).
        .codec_path("crate::codec::Codec")
        // A page of a listing the controller can fill with jobs it encoded itself
        // (src/pages.rs).
        .extern_path(
            ".gpuctl.v1.ListJobsResponse",
            "crate::pages::ListJobsResponse",
        )
        .compile_protos(&["proto/gpuctl.proto", "proto/store.proto"], &["proto"])?;
    Ok(())
}
