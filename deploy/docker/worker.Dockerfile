# syntax=docker/dockerfile:1
# The worker: the boulder-worker agent and the boulder-trainer it spawns (it looks for the
# trainer in its own directory), and boulder-tokens to make token shards where the data is.
# /metrics on 9465; no gRPC server of its own.
# Build from the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t boulder-worker:0.1.0 .
#   (--build-arg CUDA_ARCHITECTURES="90a-real" builds for Hopper only, faster)
#
# Built on NVIDIA's CUDA devel image, run on the runtime image of the same CUDA release and
# distro (Ubuntu 24.04). The runtime stage installs the runtime packages of exactly the
# libraries the build stage linked (runtime-deps.sh): package names and versions differ
# between distro releases, so both stages must be the same one. The runtime image already
# holds cuBLAS and NCCL; the GPU driver comes from the host through the NVIDIA container
# runtime. CUDA 12.8 runs on drivers >= 525 (minor-version compatibility); 570 or newer is
# what 12.8 was released with.
ARG CUDA_VERSION=12.8.1

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
ARG CUDA_ARCHITECTURES="80-real;90a-real"
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
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBOULDER_CUDA=ON \
      "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}" \
      "-DBOULDER_SUBDIRS=common;kernels;worker/comm;worker/engine;worker/agent;server;client" \
 && cmake --build build --target boulder-worker boulder-trainer boulder-tokens \
 && runtime-deps.sh build/bin/boulder-worker build/bin/boulder-trainer build/bin/boulder-tokens \
      > /runtime-packages.txt

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=build /runtime-packages.txt /tmp/runtime-packages.txt
# Packages the runtime image already has (CUDA's, NCCL) are left as they are: installing
# them by name could upgrade them past the CUDA release the binaries were built with.
RUN apt-get update \
 && missing=$(while read -r p; do \
      dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"; \
    done < /tmp/runtime-packages.txt) \
 && if [ -n "$missing" ]; then \
      echo "$missing" | xargs apt-get install -y --no-install-recommends; \
    fi \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && groupadd --system --gid 10001 boulder \
 && useradd --system --uid 10001 --gid boulder --home-dir /var/lib/boulder --create-home \
      --shell /usr/sbin/nologin boulder \
 && install -d -o 10001 -g 10001 /var/lib/boulder/work
COPY --from=build /src/build/bin/boulder-worker /src/build/bin/boulder-trainer \
     /src/build/bin/boulder-tokens /usr/local/bin/
USER 10001:10001
WORKDIR /var/lib/boulder
EXPOSE 9465
# A TCP connect to the metrics port, the worker's only listener (no curl in the image).
# Kubernetes does not use this: the manifests probe GET /metrics.
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
  CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9465"]
ENTRYPOINT ["/usr/local/bin/boulder-worker"]
# Point --coordinator at your coordinator: docker run ... boulder-worker:0.1.0 --coordinator=HOST:7070 ...
# Mount the CA at /etc/boulder/tls/ca.crt and the join token at /etc/boulder/auth/join-token.
CMD ["--coordinator=boulder-coordinator:7070", "--metrics-listen=0.0.0.0:9465", "--work-dir=/var/lib/boulder/work", "--tls-ca=/etc/boulder/tls/ca.crt", "--join-token-file=/etc/boulder/auth/join-token"]
