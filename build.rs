//! Generates the Charon API (`proto/charon/v1/charon.proto`) for the client
//! feature (the server and the layer include it), with the protoc binary
//! vendored by `protoc-bin-vendored`; and names the commit the binary is
//! built from (`charon --version`); and assembles the Redis store's batch
//! script from its pieces (`src/store/redis/decide/`, one chunk per kind in
//! `src/store/redis/kinds/`).

fn main() {
    println!("cargo:rerun-if-changed=proto/charon/v1/charon.proto");
    commit();
    decide_script();
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

/// `decide.lua` in `OUT_DIR`: the head (helpers, the clock, what each chunk
/// registers), the hit logs, every kind's chunk in the order of its file
/// name, then the batch that dispatches to them. One script, so one
/// `EVALSHA`, atomic as before; a kind's Lua is a file of its own, found
/// here without a list to keep (docs/redis.md#how-a-decision-runs).
fn decide_script() {
    let root = std::path::Path::new("src/store/redis");
    let kinds = root.join("kinds");
    println!("cargo:rerun-if-changed={}", kinds.display());
    let mut chunks = vec![root.join("decide/head.lua"), root.join("decide/logs.lua")];
    let mut per_kind: Vec<std::path::PathBuf> = match std::fs::read_dir(&kinds) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "lua"))
            .collect(),
        Err(error) => panic!("cannot list {}: {error}", kinds.display()),
    };
    per_kind.sort();
    chunks.extend(per_kind);
    chunks.push(root.join("decide/batch.lua"));
    let mut script = String::new();
    for chunk in &chunks {
        println!("cargo:rerun-if-changed={}", chunk.display());
        match std::fs::read_to_string(chunk) {
            Ok(text) => {
                script.push_str(&text);
                if !text.ends_with('\n') {
                    script.push('\n');
                }
            }
            Err(error) => panic!("cannot read {}: {error}", chunk.display()),
        }
    }
    let out_dir = match std::env::var("OUT_DIR") {
        Ok(dir) => std::path::PathBuf::from(dir),
        Err(error) => panic!("cargo sets OUT_DIR: {error}"),
    };
    if let Err(error) = std::fs::write(out_dir.join("decide.lua"), script) {
        panic!("cannot write decide.lua: {error}");
    }
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
