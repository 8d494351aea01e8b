#!/usr/bin/env python3
"""Makes the Gemma 3 tokenizer reference of the real-model tests (run once; output committed):

  scripts/get_model.sh gemma3      # -> models/gemma-3-270m-q4_k_m.gguf
  python3 -m venv /tmp/refvenv
  /tmp/refvenv/bin/pip install transformers==5.24.0 tokenizers==0.23.3 gguf==0.19.0 \
      sentencepiece==0.2.3 protobuf numpy torch
  /tmp/refvenv/bin/python tests/unit/model_real/make_gemma_reference.py \
      models/gemma-3-270m-q4_k_m.gguf tests/unit/model_real/testdata

Writes gemma3_token_ids.json: for each string (make_reference.py's STRINGS, then Gemma extras),
- "ids": what HF transformers gives, `AutoTokenizer.from_pretrained(dir, gguf_file=name)`
  (GemmaTokenizer built from the GGUF), encode(text, add_special_tokens=False);
- "round_trips": whether its decode() gives the text back;
- "spm_ids", only where they differ from "ids": what the `sentencepiece` library gives with a
  ModelProto rebuilt from the GGUF (BPE, byte_fallback, identity normalizer, no dummy prefix;
  pieces, scores and types from tokenizer.ggml.*, user-defined whitespace runs spelled with U+2581
  as in the original model), after splitting the text on the control tokens (type 3) as HF does.
  SentencePiece matches user-defined pieces longest-first, HF merges runs of spaces pairwise, so
  the two differ on runs of more than 31 spaces (the longest space token); duet follows
  SentencePiece (the tokenizer Gemma was trained with).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import STRINGS  # noqa: E402

import sentencepiece as spm  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from sentencepiece import sentencepiece_model_pb2 as spm_pb2  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

GEMMA_STRINGS = [
    "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\nWrite a haiku.<end_of_turn>\n<start_of_turn>model\nSure<end_of_turn>",
    "abc<start_of_turn>def<end_of_turn>ghi",
    " <end_of_turn> spaced control ",
    "<pad><eos><unk><mask><unused0><unused98>",
    "[multimodal]<start_of_image><end_of_image>",
    "<table><tr><td>1</td></tr></table> <b>bold</b> <code>x</code>",
    "not a tag: <tablex> <0x41> <bos",
    " hello",
    "  hello",
    "hello ",
    "hello  ",
    "a  b   c    d     e",
    "x" + " " * 31 + "y",
    "x" + " " * 32 + "y",
    " " * 40 + "forty",
    " " * 70,
    "\tindented\t\ttwice\t\t\tthrice",
    "\n",
    "\n\n\n\n\nfive newlines\n",
    "line\r\nline\rline",
    "12345678901234567890 0.5 1,000,000",
    "antidisestablishmentarianism pneumonoultramicroscopic",
    "pre\u2581existing \u2581 marker",
    "Byte fallback: \U00020000 \U000F0000 \ua000 \u16a0 \u1400 \u0800 \U00010000",
    "nul\x00bell\x07",
    "Русский текст, العربية, हिन्दी, ภาษาไทย, Ελληνικά",
    "Family: 👨‍👩‍👧‍👦, flags 🇯🇵🇩🇪, skin 👋🏿",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "    def indented(self):\n        return {'k': [1, 2, 3]}\n",
    "Ünïcödé ÀÉÎÕÜ ñ ç ß ø å œ",
]

SPACE = "\u2581"


def spm_processor(reader):
    toks = reader.fields["tokenizer.ggml.tokens"].contents()
    scores = reader.fields["tokenizer.ggml.scores"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    m = spm_pb2.ModelProto()
    piece = m.SentencePiece
    kind = {1: piece.NORMAL, 2: piece.UNKNOWN, 3: piece.CONTROL, 4: piece.USER_DEFINED,
            5: piece.UNUSED, 6: piece.BYTE}
    for t, s, k in zip(toks, scores, types):
        p = m.pieces.add()
        # llama.cpp's converter spells user-defined spaces as real spaces; the model has U+2581.
        p.piece = t.replace(" ", SPACE) if k == 4 else t
        p.score = s
        p.type = kind[k]
    m.trainer_spec.model_type = m.trainer_spec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.vocab_size = len(toks)
    m.trainer_spec.unk_id = reader.fields["tokenizer.ggml.unknown_token_id"].contents()
    m.trainer_spec.bos_id = reader.fields["tokenizer.ggml.bos_token_id"].contents()
    m.trainer_spec.eos_id = reader.fields["tokenizer.ggml.eos_token_id"].contents()
    m.trainer_spec.pad_id = reader.fields["tokenizer.ggml.padding_token_id"].contents()
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = reader.fields["tokenizer.ggml.add_space_prefix"].contents()
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    controls = sorted({t for t, k in zip(toks, types) if k == 3}, key=len, reverse=True)
    ids = {t: i for i, t in reversed(list(enumerate(toks)))}
    return sp, controls, ids


def spm_encode(sp, controls, ids, text):
    """Control tokens matched whole (leftmost, longest), the text between through sentencepiece."""
    out, pos, start = [], 0, 0
    while pos < len(text):
        hit = next((c for c in controls if text.startswith(c, pos)), None)
        if hit is None:
            pos += 1
            continue
        if pos > start:
            out += sp.encode(text[start:pos])
        out.append(ids[hit])
        pos += len(hit)
        start = pos
    if start < len(text):
        out += sp.encode(text[start:])
    return out


def main():
    gguf_path, out_dir = sys.argv[1], sys.argv[2]
    reader = GGUFReader(gguf_path)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                        gguf_file=os.path.basename(gguf_path))
    sp, controls, ids = spm_processor(reader)
    cases, differ = [], 0
    for s in STRINGS + GEMMA_STRINGS:
        hf = tok.encode(s, add_special_tokens=False)
        case = {"text": s, "ids": hf, "round_trips": tok.decode(hf) == s}
        sp_ids = spm_encode(sp, controls, ids, s)
        if sp_ids != hf:
            case["spm_ids"] = sp_ids
            differ += 1
        cases.append(case)
    with_bos = tok.encode("Hello", add_special_tokens=True)
    with open(f"{out_dir}/gemma3_token_ids.json", "w", encoding="utf-8") as f:
        json.dump({"made_by": "tests/unit/model_real/make_gemma_reference.py (HF transformers "
                              "from the GGUF; sentencepiece where it differs)",
                   "bos_id": tok.bos_token_id, "eos_id": tok.eos_token_id,
                   "hello_with_bos": with_bos, "cases": cases},
                  f, ensure_ascii=False, indent=1)
    print(f"{len(cases)} strings, {differ} where sentencepiece differs from HF", file=sys.stderr)


if __name__ == "__main__":
    main()
