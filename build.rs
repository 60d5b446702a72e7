//! Generates the Charon API (`proto/charon/v1/charon.proto`) for the client
//! feature (the server and the layer include it), with the protoc binary
//! vendored by `protoc-bin-vendored`.

fn main() {
    println!("cargo:rerun-if-changed=proto/charon/v1/charon.proto");
    #[cfg(feature = "client")]
    generate();
}

#[cfg(feature = "client")]
fn generate() {
    let protoc = match protoc_bin_vendored::protoc_bin_path() {
        Ok(path) => path,
        Err(error) => panic!("no vendored protoc for this platform: {error}"),
    };
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC.
    unsafe { std::env::set_var("PROTOC", protoc) };
    // The descriptor set feeds gRPC server reflection.
    let out_dir = match std::env::var("OUT_DIR") {
        Ok(dir) => std::path::PathBuf::from(dir),
        Err(error) => panic!("cargo sets OUT_DIR: {error}"),
    };
    if let Err(error) = tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("charon_v1_descriptor.bin"))
        .compile_protos(&["proto/charon/v1/charon.proto"], &["proto"])
    {
        panic!("cannot compile proto/charon/v1/charon.proto: {error}");
    }
}
