#!/usr/bin/env bash
# Optional: prepares .offline_deps/cluster/ for run_device_checks.sh's cluster step, which runs
# `duet serve --loopback --device=cuda` (prefill and decode nodes with their KV pools on the GPU,
# staged through host mirrors) on a GPU host that cannot build duet (no gRPC, UCX, protobuf)
# and may have no network: this packs a stripped `duet` and `duet-make-model`
# built here (with CUDA, e.g. `ninja -C build duet duet-make-model`), the CUDA backend's plugin
# (lib/libduet_cuda_backend.so, which duet finds at bin/../lib) and the runtime libraries
# they load, taken from Debian 12's packages (apt-get download, dpkg -x here, never into /) into
# .offline_deps/cluster.tar.xz (bin/, lib/; about 12 MB).
#   tests/gpu/pack_offline_cluster.sh [BUILD_DIR]      # ~1 min (xz); then copy .offline_deps
# Limits: the binaries need glibc >= 2.36 and libstdc++ from GCC 12 or newer on the GPU host
# (they are not packed); the check below only shows that every library resolves from the pack.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
build=${1:-build}
dest=.offline_deps/cluster
rm -rf "$dest" "$dest.tmp" "$dest.tar.xz.tmp"
pkgs=(libgrpc++1.51 libgrpc29 libprotobuf32 libucx0 libabsl20220623 libre2-9 libc-ares2
      libopenblas0-pthread libcpp-httplib0.11 libnuma1 libbrotli1 libssl3)
for bin in cli/duet cli/duet-make-model; do
  [[ -x $build/$bin ]] || { echo "missing $build/$bin: build it first" >&2; exit 2; }
done
plugin=$build/lib/libduet_cuda_backend.so
if [[ ! -f $plugin ]]; then
  echo "$plugin is missing: no CUDA backend (configure found no nvcc?)" >&2
  exit 2
fi
exclude=$(git rev-parse --git-path info/exclude)  # .git is a file in a worktree
mkdir -p "$(dirname "$exclude")"
if ! grep -qx '/.offline_deps/' "$exclude" 2>/dev/null; then
  echo '/.offline_deps/' >> "$exclude"
fi
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp/debs" "$dest.tmp/bin"
strip -o "$dest.tmp/bin/duet" "$build/cli/duet"
strip -o "$dest.tmp/bin/duet-make-model" "$build/cli/duet-make-model"
mkdir -p "$dest.tmp/lib"
strip -o "$dest.tmp/lib/libduet_cuda_backend.so" "$plugin"
(cd "$dest.tmp/debs" && apt-get download "${pkgs[@]}")
for deb in "$dest.tmp"/debs/*.deb; do dpkg -x "$deb" "$dest.tmp/prefix"; done
lib=$dest.tmp/prefix/usr/lib/x86_64-linux-gnu
# Keep only what duet and the plugin load (ldd, symlinks resolved) and UCX's transport modules.
LD_LIBRARY_PATH=$lib:$lib/openblas-pthread ldd "$dest.tmp/bin/duet" \
  "$dest.tmp/lib/libduet_cuda_backend.so" | awk '{print $3}' |
  grep "^$dest.tmp/prefix" | sort -u | while read -r so; do cp -L "$so" "$dest.tmp/lib/"; done
cp -rL "$lib/ucx" "$dest.tmp/lib/ucx"
rm -rf "$dest.tmp/debs" "$dest.tmp/prefix"
# Every non-system library must resolve from the pack (the CUDA ones from the GPU machine's).
missing=$(LD_LIBRARY_PATH=$dest.tmp/lib ldd "$dest.tmp/bin/duet" \
  "$dest.tmp/lib/libduet_cuda_backend.so" |
  grep -E 'grpc|gpr|upb|protobuf|uc[pstm]|absl|re2|cares|openblas|httplib|numa|brotli|ssl|crypto' |
  grep -v "$dest.tmp/lib" || true)
if [[ -n $missing ]]; then
  echo "not resolved from the pack:" >&2
  echo "$missing" >&2
  exit 3
fi
# xz: libopenblas alone is 35 MB unpacked; keeping the pack small.
tar -C "$dest.tmp" -cJf "$dest.tar.xz.tmp" bin lib
rm -rf "$dest.tmp"
mv "$dest.tar.xz.tmp" "$dest.tar.xz"
du -sh "$dest.tar.xz"
echo "packed: .offline_deps (run_device_checks.sh runs the cluster step when $dest.tar.xz exists)"
