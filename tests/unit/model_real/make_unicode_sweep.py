#!/usr/bin/env python3
"""Makes the Unicode reference data of the pre-tokenizer and tokenizer tests (run once; the
outputs are committed, and no test runs Python):

  python3 -m venv /tmp/uvenv
  /tmp/uvenv/bin/pip install tokenizers==0.23.3 gguf==0.19.0 numpy unicodedata2==17.0.1
  scripts/get_model.sh smollm2
  /tmp/uvenv/bin/python tests/unit/model_real/make_unicode_sweep.py \
      models/smollm2-135m-instruct-q4_1.gguf tests/unit/model_real/testdata

(about three minutes). The pre-tokenizers are the ones make_reference.py builds: gpt2 =
ByteLevel(use_regex) (the GPT-2 regex, run by Oniguruma in `tokenizers`), smollm =
Sequence[Digits(individual_digits), ByteLevel], llama3 and qwen2 = Sequence[Split(Regex(...)),
ByteLevel(use_regex=False)] (also Oniguruma). Writes

- unicode_classes.json: what HF's pre-tokenizers do with every code point U+0000..U+10FFFF
  (surrogates excepted), found by probing them one code point c at a time:
  - "regex": the class the regexes give c, as code point ranges: "L" (\\p{L}: "a"+c is one
    ByteLevel word), "N" (\\p{N}: "1"+c is one word), "S" (\\s: "\\t"+c is one word); every other
    code point is "O" ("!"+c is one word: [^\\s\\p{L}\\p{N}]). Each code point is in exactly one
    class, and the Split regex engine gives the same classes (both checked here).
  - "digits_numeric": the code points that Digits(individual_digits) isolates ("a"+c+"b" is three
    words): Rust's char::is_numeric, which is not the regexes' \\p{N} (see the printed summary).
  - "ignore_case": for each letter of the Llama-3 contractions (?i:'s|'t|'re|'ve|'m|'ll|'d), the
    code points (?i:x) matches.
  - "summary": how these compare with the general categories of unicodedata2's Unicode version.
- unicode_sweep.json: for a sample of code points c of every general category (Unicode 17.0 via
  unicodedata2; Cs excepted, it is not UTF-8), the text TEMPLATE with c put at each {c}: c between
  letters, after spaces, next to digits, doubled, after punctuation, an apostrophe, a newline and
  a tab, at the start and at the end. Sampled: for each category, the first and last code point
  of up to RUNS_PER_CATEGORY of its ranges (evenly spread over all planes); the boundaries of
  every range where the regexes' L/N classes differ from Python 3.11's unicodedata (Unicode 14.0)
  or from Digits' numeric set; and SPECIAL. For each: the words of the four pre-tokenizers as
  UTF-8 byte lengths, and the ids of an HF BPE built from the GGUF's vocabulary and merges with
  SmolLM2's pre-tokenizer and control tokens (as make_reference.py builds it); "lossy" marks the
  cases whose ids do not decode to the text (SmolLM2's vocabulary lacks the bytes 0x04 0x06 0x13
  0x14 0x16 0x1D 0xF1 0xF2 0xF5-0xFF, and BPE drops a byte it lacks).
"""
import json
import sys
import unicodedata

import unicodedata2
from tokenizers import Regex, pre_tokenizers

from make_reference import hf_pre_tokenizers, smollm2_bpe

TEMPLATE = "{c}ab a{c}b {c}1{c}{c} x!{c}'{c}\n{c}\t{c}  {c}12{c}3{c}\n {c}"
RUNS_PER_CATEGORY = 10
SPECIAL = [
    0x00, 0x1C, 0x1D, 0x1E, 0x1F, 0x7F, 0x85, 0xA0, 0xAD, 0xB2, 0xB9, 0xBD, 0x130, 0x17F, 0x300,
    0x660, 0x6F0, 0x180E, 0x200B, 0x200C, 0x200D, 0x2028, 0x2029, 0x2060, 0x212A, 0x2162, 0x2460,
    0x3007, 0xFB01, 0xFEFF, 0xFF10, 0xFFFD, 0xFFFE, 0xFFFF, 0x1D7CE, 0x1F600, 0xE000, 0xF0000,
    0x10FFFD, 0x10FFFF,
] + [p << 16 | low for p in range(1, 17) for low in (0, 0xFFFF)]  # each plane's ends
CONTRACTION_LETTERS = "delmrstv"


def code_points():
    return [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]


def ranges(cps):
    """Sorted code points -> [[lo, hi], ...]."""
    out = []
    for cp in cps:
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return out


def count(pre, text):
    return len(pre.pre_tokenize_str(text))


def regex_class(pre, c):
    hits = [k for k, probe in (("L", "a"), ("N", "1"), ("S", "\t"), ("O", "!"))
            if count(pre, probe + c) == 1]
    assert len(hits) == 1, (hex(ord(c)), hits)
    return hits[0]


def classes(pres):
    """The classes of unicode_classes.json, and a check of the probes that bpe_tokenizer_test.cc
    runs on duet's pre-tokenizers: each must give here what the classes say."""
    split = pre_tokenizers.Split(Regex(r"\p{L}+|\p{N}+|\s+|[^\s\p{L}\p{N}]+"), behavior="isolated")
    digits = pre_tokenizers.Digits(individual_digits=True)
    regex, numeric = {}, []
    for cp in code_points():
        c = chr(cp)
        regex[cp] = k = regex_class(pres["gpt2"], c)
        assert regex_class(split, c) == k, hex(cp)
        is_numeric = count(digits, "a" + c + "b") == 3
        if is_numeric:
            numeric.append(cp)
        assert (count(pres["smollm"], " " + c) == 2) == is_numeric, hex(cp)
        for name in ("llama3", "qwen2"):
            assert (count(pres[name], "a" + c) == 1) == (k == "L"), (name, hex(cp))
            assert (count(pres[name], " " + c) == 2) == (k == "N"), (name, hex(cp))
            assert (count(pres[name], "\t" + c + "\t") == 1) == (k == "S" and c not in "\r\n"), (
                name, hex(cp))
    folds = {}
    for x in CONTRACTION_LETTERS:
        removed = pre_tokenizers.Split(Regex(f"(?i:{x})"), behavior="removed")
        folds[x] = [cp for cp in code_points() if not removed.pre_tokenize_str(chr(cp))]
    fold = {x: {chr(cp) for cp in v} for x, v in folds.items()}
    one = fold["s"] | fold["t"] | fold["m"] | fold["d"]
    for cp in code_points():
        if regex[cp] != "L":
            continue
        c = chr(cp)
        for name in ("llama3", "qwen2"):
            for text, contraction in (("'" + c + "x", c in one),
                                      ("'" + c + "ex", c in one | fold["r"] | fold["v"]),
                                      ("'" + c + "lx", c in one | fold["l"]),
                                      ("'r" + c + "x", c in fold["e"]),
                                      ("'l" + c + "x", c in fold["l"])):
                assert (count(pres[name], text) == 2) == contraction, (name, repr(text))
    return regex, numeric, folds


def category_set(db, prefix):
    return {cp for cp in code_points() if db.category(chr(cp)).startswith(prefix)}


def summary(regex, numeric):
    out = {}
    for name, db in (("unicodedata", unicodedata), ("unicodedata2", unicodedata2)):
        v = db.unidata_version
        for cls, gc, cps in (("regex L", "L", {cp for cp, k in regex.items() if k == "L"}),
                             ("regex N", "N", {cp for cp, k in regex.items() if k == "N"}),
                             ("digits_numeric", "N", set(numeric))):
            cat = category_set(db, gc)
            out[f"{cls} vs gc={gc} of Unicode {v}"] = {
                "only_hf": len(cps - cat), "only_unicode": len(cat - cps)}
    return out


def sample(regex, numeric):
    assert unicodedata2.unidata_version == "17.0.0", unicodedata2.unidata_version
    runs = {}  # category -> [[lo, hi], ...]
    prev = None
    for cp in code_points():
        cat = unicodedata2.category(chr(cp))
        if cat == prev and runs[cat][-1][1] == cp - 1:
            runs[cat][-1][1] = cp
        else:
            runs.setdefault(cat, []).append([cp, cp])
        prev = cat
    picked = set(SPECIAL)
    for cat, rs in runs.items():
        n, k = len(rs), RUNS_PER_CATEGORY
        idx = sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if n > k else range(n)
        for i in idx:
            picked.update(rs[i])
    # Where the old tables (Unicode 14.0) or the regexes' \p{N} disagree with HF.
    numeric = set(numeric)

    def old(cp):
        cat = unicodedata.category(chr(cp))[0]
        return cat if cat in "LN" else "O"

    def hf(cp):
        return regex[cp] if regex[cp] in "LN" else "O"

    odd = [cp for cp in code_points()
           if old(cp) != hf(cp) or (cp in numeric) != (hf(cp) == "N")]
    for lo, hi in ranges(odd):
        picked.update((lo, hi))
    return sorted(picked), runs


def main():
    gguf_path, out_dir = sys.argv[1], sys.argv[2]
    pres = hf_pre_tokenizers()
    regex, numeric, folds = classes(pres)
    info = summary(regex, numeric)
    print(json.dumps(info, indent=1), file=sys.stderr)
    with open(f"{out_dir}/unicode_classes.json", "w") as f:
        json.dump({"made_by": "tests/unit/model_real/make_unicode_sweep.py (HF tokenizers 0.23.3)",
                   "regex": {k: ranges([cp for cp, v in regex.items() if v == k]) for k in "LNS"},
                   "digits_numeric": ranges(numeric), "ignore_case": folds, "summary": info},
                  f, separators=(",", ":"))
        f.write("\n")

    tk = smollm2_bpe(gguf_path)
    cps, runs = sample(regex, numeric)
    lines = []
    for cp in cps:
        text = TEMPLATE.replace("{c}", chr(cp))
        case = {"cp": cp, "cat": unicodedata2.category(chr(cp))}
        for name, pre in pres.items():
            case[name] = [len(text[a:b].encode()) for _, (a, b) in pre.pre_tokenize_str(text)]
        case["ids"] = tk.encode(text).ids
        if tk.decode(case["ids"], skip_special_tokens=False) != text:
            case["lossy"] = 1  # a UTF-8 byte of c is not in the vocabulary: BPE drops it
        lines.append(json.dumps(case, separators=(",", ":")))
    with open(f"{out_dir}/unicode_sweep.json", "w") as f:
        f.write('{"made_by":"tests/unit/model_real/make_unicode_sweep.py (HF tokenizers 0.23.3, '
                f'categories of Unicode {unicodedata2.unidata_version})",\n')
        f.write(f'"template":{json.dumps(TEMPLATE)},\n"cases":[\n')
        f.write(",\n".join(lines))
        f.write("\n]}\n")
    cats = sorted({json.loads(x)["cat"] for x in lines})
    print(f"{len(cps)} code points, {len(cats)} categories: {' '.join(cats)}; "
          f"ranges per category: {dict((k, len(v)) for k, v in sorted(runs.items()))}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
