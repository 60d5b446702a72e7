# syntax=docker/dockerfile:1
# The Charon image: the `charon` binary (sidecar: `serve`; admission webhook:
# `inject`; `check`) on distroless, as uid/gid 65532 (nonroot).
#
#   docker build -t charon:0.9.0 --build-arg CHARON_COMMIT="$(git rev-parse --short=12 HEAD)" .
#   kind load docker-image charon:0.9.0        # or push it to your registry
#
# Tags: `charon:<version>` (Cargo.toml's version; what deploy/ runs, and
# what `charon --version` prints), and if you like the commit's. The build
# context has no .git: CHARON_COMMIT names the commit for --version and the
# image's labels (`unknown` without it).
#
# BuildKit (the default builder) caches Cargo's registry and target folder
# between builds.

# The toolchain the tests run with (rustc 1.95); the crate's rust-version is
# a floor, not what the dependencies were tested with.
FROM rust:1.95-bookworm AS builder
WORKDIR /src
# Only what the build reads: the manifest and lock file, the build script and
# the protos it compiles (protoc is vendored), the sources, benches/
# (Cargo.toml declares a bench, and Cargo wants its file present) and the
# load tool's crate (a workspace member Cargo reads, never built here).
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY src ./src
COPY benches ./benches
COPY tools ./tools
# The dist profile (fat LTO, one codegen unit) keeps line tables (debug = 1)
# for profiling on the host; the image drops them by default.
# --build-arg STRIP=none keeps them.
ARG STRIP=debuginfo
ARG CHARON_COMMIT=unknown
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    CARGO_PROFILE_DIST_STRIP="$STRIP" CHARON_COMMIT="$CHARON_COMMIT" cargo build --profile dist --locked --bin charon \
    && install -D -m 0755 target/dist/charon /out/charon \
    && install -D -m 0755 target/dist/charon /usr/local/bin/charon \
    && ln -s /usr/local/bin/charon /out/ratelimit

# glibc and libgcc (the binary links them), CA certificates, tzdata; no
# shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
ARG CHARON_COMMIT=unknown
LABEL org.opencontainers.image.title="charon" \
      org.opencontainers.image.version="0.9.0" \
      org.opencontainers.image.revision="$CHARON_COMMIT"
COPY --from=builder /out/charon /usr/local/bin/charon
# Started as /bin/ratelimit (Envoy Gateway's command), charon reads
# envoyproxy/ratelimit's environment (docs/envoy-compatibility.md).
COPY --from=builder /out/ratelimit /bin/ratelimit
USER 65532:65532
# gRPC (RateLimitService; the sidecar binds it to 127.0.0.1 in Kubernetes),
# admin HTTP (/healthz, /readyz, /metrics), the webhook's HTTPS.
EXPOSE 8081 9102 8443
ENTRYPOINT ["/usr/local/bin/charon"]
CMD ["serve", "--config", "/etc/charon"]
