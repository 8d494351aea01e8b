#!/usr/bin/env bash
# Checks that the C/C++ lines changed since BASE follow .clang-format (clang-format-14).
#   scripts/check_format.sh          # BASE: merge-base with origin/main, else HEAD~1 (see below)
#   scripts/check_format.sh main     # lines changed since main (the work tree included)
#   scripts/check_format.sh --all    # every line of every C/C++ file
# Only changed lines are checked: parts of the tree predate the check, and reformatting them
# would conflict with work in flight. Generated files ("Do not edit by hand") are skipped.
# To fix: clang-format-14 -i FILE (whole file) or clang-format-diff-14 -p1 -i < <(git diff -U0).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
FORMAT="${DUET_CLANG_FORMAT:-clang-format-14}"
if ! command -v "$FORMAT" >/dev/null; then
  echo "check_format: $FORMAT not found (scripts/install_deps.sh installs clang-format)" >&2
  exit 2
fi
PATTERNS=('*.h' '*.cc' '*.cpp' '*.cu' '*.cuh')

generated() { head -n 3 "$1" | grep -q "Do not edit by hand"; }

if [ "${1:-}" = "--all" ]; then
  status=0
  while IFS= read -r f; do
    generated "$f" && continue
    "$FORMAT" --dry-run --Werror "$f" || status=1
  done < <(git ls-files -- "${PATTERNS[@]}")
  if [ "$status" -ne 0 ]; then echo "check_format: unformatted files (above)" >&2; fi
  exit "$status"
fi

BASE="${1:-}"
if [ -z "$BASE" ]; then
  # On a branch: everything since it left main. On main itself (CI's clone) or without
  # origin/main: what the last commit (or merge) changed.
  BASE="$(git merge-base origin/main HEAD 2>/dev/null || true)"
  if [ "$BASE" = "$(git rev-parse -q --verify HEAD || true)" ]; then BASE=""; fi
  if [ -z "$BASE" ] && git rev-parse -q --verify HEAD~1 >/dev/null; then BASE="HEAD~1"; fi
  if [ -z "$BASE" ]; then
    echo "check_format: no origin/main and no parent commit; nothing to compare with, skipped"
    exit 0
  fi
fi

# "FILE START:END ..." per changed file, from the zero-context diff's hunk headers (new side).
status=0
checked=0
while read -r f ranges; do
  [ -f "$f" ] || continue
  generated "$f" && continue
  args=()
  for r in $ranges; do args+=("--lines=$r"); done
  checked=$((checked + 1))
  "$FORMAT" --dry-run --Werror "${args[@]}" "$f" || status=1
done < <(git diff -U0 --no-color --src-prefix=a/ --dst-prefix=b/ --diff-filter=ACMR "$BASE" \
  -- "${PATTERNS[@]}" | awk '
  /^\+\+\+ / {
    if (file != "" && ranges != "") print file, ranges
    file = substr($2, 3); ranges = ""; next
  }
  /^@@ / {
    split($3, a, ","); start = substr(a[1], 2); count = (a[2] == "" ? 1 : a[2])
    if (count > 0) ranges = ranges " " start ":" (start + count - 1)
  }
  END { if (file != "" && ranges != "") print file, ranges }')

if [ "$status" -ne 0 ]; then
  echo "check_format: changed lines not formatted per .clang-format (above); base $BASE" >&2
  exit 1
fi
echo "check_format: $checked changed C/C++ files formatted (base $BASE)"
