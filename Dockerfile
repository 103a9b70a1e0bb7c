# syntax=docker/dockerfile:1
#
# choria-provisioner: the provisioner, the Kubernetes operator and the fleet
# simulator in one image.
#
#   docker build -t choria-provisioner:0.1.0-$(git rev-parse --short=12 HEAD) .
#
# Give each build a tag of its own (above: the commit), or deploy it by
# digest: a node that pulled a tag once does not pull it again
# (imagePullPolicy IfNotPresent), so an image pushed again under that tag
# never reaches it.
#
# Not built in CI (no container engine there); see README.md.
#
# The runtime image is Debian slim rather than distroless or scratch on purpose:
# provisioning helpers are usually shell scripts (examples/helper.sh uses sh and
# sed), so /bin/sh and coreutils stay. It runs as the non-root user 65532 and
# needs only /tmp to be writable (mount an emptyDir there when the root
# filesystem is read-only, as the chart and the operator do).

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=trixie

FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
# benches/ is copied because Cargo.toml names a bench target (cargo refuses the
# manifest without it). The crate registry and target/ are BuildKit cache mounts,
# so a rebuild only compiles what changed.
COPY Cargo.toml Cargo.lock ./
COPY benches ./benches
COPY src ./src
COPY crates ./crates
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin choria-provisioner \
 && install -D -m 0755 target/release/choria-provisioner /out/choria-provisioner

# Same Debian release as the builder, so the glibc the binary was linked against
# is the one it runs with.
FROM docker.io/library/debian:${DEBIAN_RELEASE}-slim
ARG VERSION=0.1.0
# The rest of this stage is the image contract (labels, packages, user,
# binary path, HOME, workdir, entrypoint, cmd): scripts/image-contract.env
# defines it, for this file and for scripts/build-image.sh, and says why each
# package is there.
# >>> image contract: generated from scripts/image-contract.env by
# scripts/check-manifests.sh --write-deploy; edit that file, not these lines.
LABEL org.opencontainers.image.title="choria-provisioner" \
      org.opencontainers.image.description="Choria provisioner, Kubernetes operator and provisioning-mode fleet simulator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin nonroot \
 && chmod 1777 /tmp
COPY --from=build /out/choria-provisioner /usr/local/bin/choria-provisioner
ENV HOME=/tmp
WORKDIR /tmp
USER 65532:65532
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/choria-provisioner"]
CMD ["--help"]
# <<< image contract
