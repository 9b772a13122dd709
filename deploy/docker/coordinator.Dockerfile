# syntax=docker/dockerfile:1
# The coordinator: boulder-coordinator, which serves gRPC on 7070 and /metrics on 9464.
# Build from the repository root:
#   docker build -f deploy/docker/coordinator.Dockerfile -t boulder-coordinator:0.1.0 .
#
# Plain Ubuntu 24.04 for both stages: the coordinator never links CUDA, so a CUDA image would
# only add gigabytes. It is the distro of the worker's nvidia/cuda *-ubuntu24.04 images, so
# all three images carry the same library versions. Build and run stages must be the same
# distro release: the runtime stage installs the runtime packages of exactly the libraries
# the build stage linked (runtime-deps.sh), and package names differ between releases
# (libgrpc++1.51t64 on 24.04, libgrpc++1.51 on Debian 12).

FROM ubuntu:24.04 AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev prometheus-cpp-dev libsqlite3-dev libyaml-cpp-dev \
      libgtest-dev libgmock-dev libgloo-dev libopenblas-dev libcli11-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The folders CMake configures (its default BOULDER_SUBDIRS less tests/), one COPY each so
# that local build directories never enter the image.
COPY CMakeLists.txt ./
COPY proto proto
COPY common common
COPY kernels kernels
COPY worker worker
COPY server server
COPY client client
COPY deploy/docker/runtime-deps.sh /usr/local/bin/runtime-deps.sh
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBOULDER_CUDA=OFF \
      "-DBOULDER_SUBDIRS=common;kernels;worker/comm;worker/engine;worker/agent;server;client" \
 && cmake --build build --target boulder-coordinator \
 && runtime-deps.sh build/bin/boulder-coordinator > /runtime-packages.txt

FROM ubuntu:24.04
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=build /runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && groupadd --system --gid 10001 boulder \
 && useradd --system --uid 10001 --gid boulder --home-dir /var/lib/boulder --create-home \
      --shell /usr/sbin/nologin boulder
COPY --from=build /src/build/bin/boulder-coordinator /usr/local/bin/boulder-coordinator
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /var/lib/boulder
# The SQLite database lives here; mount a volume to keep it.
VOLUME /var/lib/boulder
EXPOSE 7070 7071 9464
# A TCP connect to the gRPC port. A real gRPC health call needs a client: grpc_health_probe
# is not packaged by Debian or Ubuntu, and the boulder CLI has no health command yet.
# Kubernetes does not use this: its native grpc probe calls grpc.health.v1.Health.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/7070"]
ENTRYPOINT ["/usr/local/bin/boulder-coordinator"]
# TLS and tokens: mount the certificate and key at /etc/boulder/tls and the tokens file at
# /etc/boulder/auth/tokens (README, Security). 7071 is the plaintext health-only port.
CMD ["--listen=0.0.0.0:7070", "--db=/var/lib/boulder/coordinator.db", "--metrics-listen=0.0.0.0:9464", "--health-listen=0.0.0.0:7071", "--tls-cert=/etc/boulder/tls/tls.crt", "--tls-key=/etc/boulder/tls/tls.key", "--auth-file=/etc/boulder/auth/tokens"]
