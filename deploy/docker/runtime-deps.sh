#!/usr/bin/env bash
# Prints, one per line and sorted, the Debian/Ubuntu packages that own the shared libraries
# the given ELF binaries load. The images' build stage runs it on the binaries it built;
# the runtime stage (same distro, same release) installs exactly that list, so the runtime
# image carries the runtime half of every -dev package the build linked, and nothing else.
#
#   runtime-deps.sh build/bin/boulder-worker build/bin/boulder-trainer > runtime-packages.txt
#
# Fails (exit 1) when a library cannot be found or belongs to no package: an image built
# anyway would fail at start. The NVIDIA driver's libraries are the exception: the build
# stage has only link stubs of them, and the NVIDIA container runtime mounts the host
# driver's copies into the container when it starts. The CUDA toolkit's own runtime libraries
# (cudart, cuBLAS/cuBLASLt, NCCL) are skipped too: the worker's runtime stage is NVIDIA's CUDA
# runtime image, which carries them, and a toolkit unpacked outside dpkg (/usr/local/cuda)
# belongs to no package.
set -euo pipefail

if [ $# -eq 0 ]; then
  echo "usage: $0 BINARY..." >&2
  exit 2
fi

driver_libs=" libcuda.so.1 libnvidia-ml.so.1 "

# candidates PATH: the spellings dpkg may know PATH by: as given, its resolved target, and
# its other spelling under the merged /usr (/lib/x -> /usr/lib/x and back).
candidates() {
  echo "$1"
  readlink -f "$1"
  case "$1" in
    /usr/*) echo "${1#/usr}" ;;
    *) echo "/usr$1" ;;
  esac
}

declare -a libs=()
status=0
for bin in "$@"; do
  if [ ! -x "$bin" ]; then
    echo "runtime-deps: $bin: not an executable" >&2
    exit 1
  fi
  ldd_out=$(ldd "$bin") || { echo "runtime-deps: ldd $bin failed" >&2; exit 1; }
  while read -r line; do
    case "$line" in
      *"=> not found"*)
        lib=${line%% *}
        if [[ "$driver_libs" != *" $lib "* ]]; then
          echo "runtime-deps: $bin needs $lib, which is not installed" >&2
          status=1
        fi ;;
      libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*) ;;  # in the CUDA runtime image
      *"=> /"*)
        path=${line#*=> }
        libs+=("${path%% (*}") ;;
      /*)
        libs+=("${line%% (*}") ;;
      *) ;;  # linux-vdso: provided by the kernel
    esac
  done <<< "$ldd_out"
done
if [ "$status" -ne 0 ]; then
  exit "$status"
fi
if [ ${#libs[@]} -eq 0 ]; then
  exit 0
fi

# One dpkg-query for every spelling of every library (each call reads the whole package
# database). Its lines are "pkg1:amd64, pkg2: /path"; a diversion lists several packages,
# the first owns the file; "diversion by" lines name no owner. Paths no package owns are
# reported on stderr, ignored here.
declare -A owner=()
mapfile -t all < <(for l in "${libs[@]}"; do candidates "$l"; done | sort -u)
while IFS= read -r line; do
  [[ "$line" == "diversion by "* ]] && continue
  pkg=${line%%: /*}
  pkg=${pkg%%,*}
  owner[${line#*: }]=${pkg%%:*}
done < <(dpkg-query -S "${all[@]}" 2>/dev/null || true)

declare -A packages=()
for l in "${libs[@]}"; do
  pkg=""
  while read -r c; do
    if [ -n "${owner[$c]:-}" ]; then
      pkg=${owner[$c]}
      break
    fi
  done < <(candidates "$l")
  if [ -z "$pkg" ]; then
    echo "runtime-deps: $l belongs to no package" >&2
    status=1
  else
    packages[$pkg]=1
  fi
done
if [ "$status" -ne 0 ]; then
  exit "$status"
fi
printf '%s\n' "${!packages[@]}" | sort
