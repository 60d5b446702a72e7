//! Generates the Charon API (`proto/charon/v1/charon.proto`) for the client
//! feature (the server and the layer include it), with the protoc binary
//! vendored by `protoc-bin-vendored`; and names the commit the binary is
//! built from (`charon --version`).

fn main() {
    println!("cargo:rerun-if-changed=proto/charon/v1/charon.proto");
    commit();
    #[cfg(feature = "client")]
    generate();
}

/// `CHARON_COMMIT` for the build: the variable of that name if set (the
/// image is built without `.git`: `--build-arg CHARON_COMMIT=...`), else
/// git's `HEAD`, else `unknown` (a source tarball).
fn commit() {
    println!("cargo:rerun-if-env-changed=CHARON_COMMIT");
    let git = |args: &[&str]| -> Option<String> {
        let output = std::process::Command::new("git").args(args).output().ok()?;
        let text = String::from_utf8(output.stdout).ok()?;
        (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
    };
    let commit = match std::env::var("CHARON_COMMIT") {
        Ok(commit) if !commit.is_empty() => commit,
        _ => {
            // Built again when HEAD moves: the files git keeps it in.
            for path in ["HEAD", "packed-refs"] {
                if let Some(file) = git(&["rev-parse", "--git-path", path]) {
                    println!("cargo:rerun-if-changed={file}");
                }
            }
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
                && let Some(file) = git(&["rev-parse", "--git-path", &branch])
            {
                println!("cargo:rerun-if-changed={file}");
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    println!("cargo:rustc-env=CHARON_COMMIT={commit}");
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
