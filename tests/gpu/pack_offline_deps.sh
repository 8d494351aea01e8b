#!/usr/bin/env bash
# Prepares .offline_deps/ (git-ignored through .git/info/exclude) for tests/gpu/run_device_checks.sh:
# a GPU host with CUDA, CMake and ninja but no Abseil, GoogleTest or nlohmann-json (and perhaps
# no network) gets their Debian 12 packages, downloaded on a host with apt sources and unpacked
# (dpkg -x) into .offline_deps/prefix, never into /. Run once, then copy the checkout with
# .offline_deps to the GPU host. Idempotent; about 5 MB.
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
dest=.offline_deps
pkgs=(libabsl-dev libabsl20220623 libgtest-dev nlohmann-json3-dev)

exclude=$(git rev-parse --git-path info/exclude)  # .git is a file in a worktree
mkdir -p "$(dirname "$exclude")"
if ! grep -qx '/.offline_deps/' "$exclude" 2>/dev/null; then
  echo '/.offline_deps/' >> "$exclude"
fi
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp/debs"
(cd "$dest.tmp/debs" && apt-get download "${pkgs[@]}")
for deb in "$dest.tmp"/debs/*.deb; do dpkg -x "$deb" "$dest.tmp/prefix"; done
# Only what a build needs: headers, libraries, CMake configs.
rm -rf "$dest.tmp/debs" "$dest.tmp/prefix/usr/share/doc" "$dest.tmp/prefix/usr/src"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
du -sh "$dest"
echo "packed: $dest (absl_DIR=$dest/prefix/usr/lib/x86_64-linux-gnu/cmake/absl)"
