# syntax=docker/dockerfile:1
# The CLI: boulder. For running it in the cluster (CI runners, a debugging pod); pods that
# run it need the label boulder.dev/client: "true" to pass the coordinator's NetworkPolicy.
# Build from the repository root:
#   docker build -f deploy/docker/cli.Dockerfile -t boulder-cli:0.1.0 .
# Run:
#   docker run --rm -e BOULDER_COORDINATOR=HOST:7070 boulder-cli:0.1.0 jobs
#
# Plain Ubuntu 24.04 for both stages, like the coordinator's image (no CUDA; the distro of
# the worker's nvidia/cuda images); the runtime stage installs the runtime packages of
# exactly the libraries the build stage linked (runtime-deps.sh).

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
 && cmake --build build --target boulder \
 && runtime-deps.sh build/bin/boulder > /runtime-packages.txt

FROM ubuntu:24.04
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=build /runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && groupadd --system --gid 10001 boulder \
 && useradd --system --uid 10001 --gid boulder --home-dir /home/boulder --create-home \
      --shell /usr/sbin/nologin boulder
COPY --from=build /src/build/bin/boulder /usr/local/bin/boulder
USER 10001:10001
WORKDIR /home/boulder
# Nothing listens in this image, so there is nothing to check.
HEALTHCHECK NONE
ENTRYPOINT ["/usr/local/bin/boulder"]
CMD ["--help"]
