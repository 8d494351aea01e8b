#!/usr/bin/env python3
"""Integration test of the coordinator's OpenAI-compatible HTTP API and /metrics.

Starts `duet serve --loopback` (1 prefill + 1 decode node, tiny synthetic model, 127.0.0.1
only) with the HTTP API and node metrics on, then:
  - the official `openai` client (installed into a venv under the build dir) streams a
    completion and a chat completion; the completion is token-exact against `duet generate`;
  - min_p, the penalties, logit_bias and min_tokens change the answer as specified (a banned
    greedy token never comes, min_tokens holds a boosted EOS back, bad values are 400s);
    top_k, stop_token_ids and max_completion_tokens too; response_format json_object gives a JSON
    object through the official client; functions, a response_format type not served,
    suffix, an unread chat_template_kwargs key and bad_words are 400s naming them, tools on a
    server without auto tool choice a 400 naming its flags, a tool message on a template that
    renders no tools a 400;
  - n choices (choice j is the n = 1 request with seed + j; streamed choices reassemble by
    index), unseeded choices that differ, a list of prompts (prompt-major choices), echo, and
    echo with logprobs (the prompt scored, exactly as generation scored the same tokens, also
    with max_tokens 0: the prompt alone, as lm-evaluation-harness asks;
    with its prefix cached); the later choices of a prompt take its KV from both nodes' caches;
  - /tokenize, /detokenize and /version;
  - a `stop` string ends a completion early and counts as ok (not cancelled) in /metrics;
  - malformed bodies get OpenAI-shaped errors with the documented status codes, through
    http.client and through curl (malformed JSON, a wrong-typed field, an oversized body);
  - /metrics (coordinator and nodes) parses with prometheus_client and its counters move;
  - a client that disconnects mid-stream cancels its request and every KV block comes back.
Exit 77 (ctest SKIP) when the venv cannot be created or the packages cannot be installed.

  http_api_test.py --duet build/cli/duet --make-model build/cli/duet-make-model --work DIR
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import openai_lib

SKIP = openai_lib.SKIP


def log(*a):
    print("[http_api_test]", *a, flush=True)


def ensure_venv(work):
    return openai_lib.ensure_venv(work, ["openai", "prometheus_client"], log)


class Cluster(openai_lib.Server):
    """`duet serve --loopback`: one prefill and one decode node on the tiny model."""

    def __init__(self, duet, model, extra=()):
        super().__init__(duet, ["--loopback", "--prefill=1", "--decode=1", "--model=" + model,
                                "--transport=shm", "--threads=1", "--kv_cache_bytes=16777216",
                                "--http_port=0", "--node_metrics"] + list(extra))


def curl_error(url, data):
    """POSTs `data` (a string, or @FILE) with curl; returns (HTTP status, the "error" object)."""
    out = subprocess.run(["curl", "-sS", "-X", "POST", "-H", "Content-Type: application/json",
                          "--data-binary", data, "-w", "\n%{http_code}", url],
                         capture_output=True, text=True, timeout=60).stdout
    body, _, status = out.rpartition("\n")
    try:
        return int(status), json.loads(body).get("error")
    except ValueError:
        return int(status or 0), body[:200]


def fetch(url):
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def samples(text):
    """{(name, frozenset(labels)): value} via prometheus_client's text-format parser."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(smp, name, **labels):
    return smp.get((name, frozenset(labels.items())), 0.0)


def reusable(m):
    """Decode KV blocks an allocation can take: free, or cached and unused."""
    return (value(m, "duet_decode_kv_blocks", state="free") +
            value(m, "duet_decode_kv_blocks", state="evictable"))


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    log("ok:", what)


def run_child(args):
    """Runs the openai-client part in the venv's python (this file, --client mode)."""
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        raise AssertionError("openai client part failed (%d)" % r.returncode)
    return json.loads(r.stdout.strip().splitlines()[-1])


def sampling_checks(c, model, prompt_ids, max_tokens, gen_ids, eos_id):
    """min_p, the penalties, logit_bias and min_tokens through the openai client (vLLM's names
    go through extra_body): what each request answered, for main() to check."""
    import openai

    def complete(**kw):
        extra = {k: kw.pop(k) for k in ("min_p", "repetition_penalty", "min_tokens", "ignore_eos")
                 if k in kw}
        r = c.completions.create(model=model, prompt=prompt_ids, max_tokens=kw.pop("n", max_tokens),
                                 extra_body=extra or None, **kw)
        return {"text": r.choices[0].text, "finish": r.choices[0].finish_reason,
                "tokens": r.usage.completion_tokens}

    def status(**kw):
        try:
            complete(**kw)
            return None
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            return [e.status_code, body.get("param")]

    # The first printable token of the greedy output that has not come before it.
    k = next(i for i in range(1, len(gen_ids)) if 32 < gen_ids[i] < 127 and
             gen_ids[i] not in gen_ids[:i])
    return {
        "k": k,
        "banned": complete(temperature=0, logit_bias={str(gen_ids[k]): -100}),
        "min_p1": complete(temperature=1.5, seed=5, min_p=1.0),
        "eos_now": complete(temperature=0, n=40, logit_bias={str(eos_id): 100}),
        "eos_min5": complete(temperature=0, n=40, logit_bias={str(eos_id): 100}, min_tokens=5),
        # 60 greedy tokens repeat some: the penalties change what follows a repeat.
        "plain60": complete(temperature=0, n=60, ignore_eos=True),
        "penalised": [complete(temperature=0, n=60, ignore_eos=True, presence_penalty=2,
                               frequency_penalty=2),
                      complete(temperature=0, n=60, ignore_eos=True, repetition_penalty=2.0)],
        "penalised_again": complete(temperature=0, n=60, ignore_eos=True, presence_penalty=2,
                                    frequency_penalty=2),
        "bad_bias_id": status(temperature=0, logit_bias={"1000000": 1}),
        "bad_repetition": status(temperature=0, repetition_penalty=0),
        "bad_min_tokens": status(temperature=0, n=4, min_tokens=5),
    }


def client_main(base_url, prompt_ids, max_tokens, gen_ids, eos_id):
    """Runs inside the venv: the official openai client against the cluster."""
    import openai
    c = openai.OpenAI(base_url=base_url + "/v1", api_key="unused")
    models = c.models.list()
    model = models.data[0].id
    # A streamed completion (greedy), prompt given as token ids.
    text, usage, finish, usage_chunk_choices = "", None, None, None
    for chunk in c.completions.create(model=model, prompt=prompt_ids, max_tokens=max_tokens,
                                      temperature=0, stream=True,
                                      stream_options={"include_usage": True}):
        if chunk.choices:
            text += chunk.choices[0].text or ""
            finish = chunk.choices[0].finish_reason or finish
        if getattr(chunk, "usage", None):
            usage = chunk.usage
            usage_chunk_choices = len(chunk.choices)
    assert usage is not None, "no usage chunk with include_usage"
    assert usage_chunk_choices == 0, "the usage chunk has choices"
    # Without include_usage, no chunk carries usage (as OpenAI and vLLM).
    unasked = [ch for ch in c.completions.create(model=model, prompt=prompt_ids, max_tokens=2,
                                                 temperature=0, stream=True)
               if getattr(ch, "usage", None)]
    assert not unasked, "usage sent without include_usage"
    # The same completion, not streamed.
    whole = c.completions.create(model=model, prompt=prompt_ids, max_tokens=max_tokens,
                                 temperature=0)
    # A streamed chat completion.
    chat, chat_finish, chat_usage, roles = "", None, None, []
    for chunk in c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8,
            temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            d = chunk.choices[0].delta
            if d.role:
                roles.append(d.role)
            chat += d.content or ""
            chat_finish = chunk.choices[0].finish_reason or chat_finish
        if getattr(chunk, "usage", None):
            chat_usage = chunk.usage
    chat_whole = c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8,
        temperature=0)
    # An error through the client: max_tokens beyond the context.
    try:
        c.completions.create(model=model, prompt="hi", max_tokens=10**6)
        err = None
    except openai.BadRequestError as e:
        err = e.status_code
    # A model the server does not serve: 404 model_not_found, as OpenAI and vLLM answer.
    try:
        c.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
        unknown_model = None
    except openai.NotFoundError as e:
        unknown_model = (e.status_code, e.code)
    check(unknown_model == (404, "model_not_found"),
          "an unknown model is a 404 model_not_found (%s)" % (unknown_model,))
    # Fields the server does not implement are refused by name, never ignored.
    refused = {}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for field, value, known in [("bad_words", ["x"], False),
                                ("response_format", {"type": "structural_tag"}, True),
                                ("functions", [tool["function"]], True),
                                ("chat_template_kwargs", {"tools_in_user_message": True},
                                 False)]:
        # Fields the client does not know (vLLM's) go through extra_body, as vLLM users send them.
        kw = {field: value} if known else {"extra_body": {field: value}}
        try:
            c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                      max_tokens=2, temperature=0, **kw)
            refused[field] = None
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            refused[field] = [e.status_code, body.get("param"), body.get("code")]
    try:
        c.completions.create(model=model, prompt="Hi", max_tokens=2, suffix="tail")
        refused["suffix"] = None
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        refused["suffix"] = [e.status_code, body.get("param"), body.get("code")]
    # Tools on a server without --enable_auto_tool_choice: auto (their default) is refused
    # naming the flags, as vLLM does.
    try:
        c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                  max_tokens=2, tools=[tool])
        auto_tools = None
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        auto_tools = [e.status_code, body.get("param"), body.get("code"), body.get("message")]
    # A tool message, on a model whose template renders no tools, is refused.
    try:
        c.chat.completions.create(model=model, max_tokens=2, messages=[
            {"role": "user", "content": "Hi"},
            {"role": "tool", "content": "42", "tool_call_id": "x"}])
        tool_role = None
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        tool_role = [e.status_code, body.get("param")]
    # Chat's max_completion_tokens wins over max_tokens (as vLLM).
    capped = c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello there"}], max_tokens=8,
        max_completion_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    # stop_token_ids (vLLM's, through extra_body): the greedy output ends at the first of them.
    stop_at = gen_ids[3]
    stopped_ids = c.completions.create(model=model, prompt=prompt_ids, max_tokens=max_tokens,
                                       temperature=0, extra_body={"stop_token_ids": [stop_at]})
    # vLLM's top_k through extra_body reaches the sampler: top_k 1 samples greedily.
    top1 = c.completions.create(model=model, prompt=prompt_ids, max_tokens=max_tokens,
                                temperature=1.5, seed=3, extra_body={"top_k": 1})
    sampling = sampling_checks(c, model, prompt_ids, max_tokens, gen_ids, eos_id)
    # JSON mode as the OpenAI SDK asks for it: the answer is a JSON object.
    json_mode = c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=96, temperature=1.0,
        seed=4, response_format={"type": "json_object"})
    print(json.dumps({
        "json_mode": [json_mode.choices[0].message.content, json_mode.choices[0].finish_reason],
        "sampling": sampling,
        "model": model, "text": text, "finish": finish,
        "usage": [usage.prompt_tokens, usage.completion_tokens, usage.total_tokens],
        "whole_text": whole.choices[0].text, "whole_finish": whole.choices[0].finish_reason,
        # The same prompts a second time: their prefixes come from the prefill node's cache.
        "whole_cached": whole.usage.prompt_tokens_details.cached_tokens
        if whole.usage and whole.usage.prompt_tokens_details else None,
        "chat_whole_cached": chat_whole.usage.prompt_tokens_details.cached_tokens
        if chat_whole.usage and chat_whole.usage.prompt_tokens_details else None,
        "chat": chat, "chat_finish": chat_finish, "roles": roles,
        "chat_usage": [chat_usage.prompt_tokens, chat_usage.completion_tokens]
        if chat_usage else None,
        "chat_whole": chat_whole.choices[0].message.content,
        "bad_request_status": err,
        "refused": refused,
        "top1_text": top1.choices[0].text,
        "tool_role": tool_role,
        "auto_tools": auto_tools,
        "capped_tokens": capped.usage.completion_tokens,
        "stop_ids": [stopped_ids.choices[0].finish_reason, stopped_ids.usage.completion_tokens,
                     gen_ids.index(stop_at) + 1],
    }))


def choices_main(base_url, prompt_ids, max_tokens, gen_ids):
    """Runs inside the venv: n, seeds per choice, lists of prompts and echo through the openai
    client; prints what each request answered, for main() to check."""
    import openai
    c = openai.OpenAI(base_url=base_url + "/v1", api_key="unused")
    model = c.models.list().data[0].id

    def texts(r):
        return [ch.text for ch in sorted(r.choices, key=lambda ch: ch.index)]

    def once(**kw):
        kw.setdefault("max_tokens", max_tokens)
        return c.completions.create(model=model, **kw)

    out = {}
    r = once(prompt=prompt_ids, temperature=1.0, seed=7, n=3)
    out["n3"], out["n3_index"] = texts(r), [ch.index for ch in r.choices]
    out["n3_usage"] = [r.usage.prompt_tokens, r.usage.completion_tokens]
    out["n3_singles"] = [once(prompt=prompt_ids, temperature=1.0, seed=7 + j).choices[0].text
                         for j in range(3)]
    parts, finishes = {}, {}
    for chunk in once(prompt=prompt_ids, temperature=1.0, seed=7, n=3, stream=True):
        for ch in chunk.choices:
            parts[ch.index] = parts.get(ch.index, "") + (ch.text or "")
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    out["n3_stream"] = [parts.get(j) for j in range(3)]
    out["n3_stream_finishes"] = [finishes.get(j) for j in range(3)]
    out["unseeded"] = texts(once(prompt=prompt_ids, temperature=1.0, n=2))
    out["unseeded_singles"] = [once(prompt=prompt_ids, temperature=1.0).choices[0].text
                               for _ in range(2)]
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello there"}],
                                  max_tokens=8, temperature=0, n=2)
    out["chat_n2"] = [ch.message.content for ch in sorted(r.choices, key=lambda ch: ch.index)]
    other = list(reversed(prompt_ids))
    r = once(prompt=[prompt_ids, other], temperature=0, n=2)
    out["batch"], out["batch_index"] = texts(r), [ch.index for ch in r.choices]
    out["batch_usage"] = [r.usage.prompt_tokens, r.usage.completion_tokens]
    out["other_single"] = once(prompt=other, temperature=0).choices[0].text
    out["other_len"] = len(other)
    r = once(prompt=["Hello, duet", "Hello, duet"], temperature=0, echo=True)
    out["echo"] = texts(r)

    # echo with logprobs: the prompt's tokens first (the first without a logprob), scored.
    def lp(choice):
        p = choice.logprobs
        return {"tokens": p.tokens, "lps": p.token_logprobs, "tops": p.top_logprobs,
                "offsets": p.text_offset, "text": choice.text}
    out["echo_lp"] = lp(once(prompt=prompt_ids, temperature=0, echo=True, logprobs=2).choices[0])
    out["echo_lp_n2"] = [lp(ch) for ch in sorted(
        once(prompt=prompt_ids, temperature=0, echo=True, logprobs=2, n=2).choices,
        key=lambda ch: ch.index)]
    out["gen_lp"] = once(prompt=prompt_ids, temperature=0, logprobs=2).choices[0].logprobs.token_logprobs
    # Teacher forcing: the prompt and its greedy output, sent as a prompt: the output's tokens
    # are scored as generation scored them.
    forced = prompt_ids + gen_ids[:-1]
    out["forced_lp"] = once(prompt=forced, temperature=0, echo=True, logprobs=0,
                            max_tokens=1).choices[0].logprobs.token_logprobs
    # A 40-token prompt scored twice: the second time its prefix is in the caches, and still
    # every token is scored, the same.
    long_ids = (prompt_ids * 4)[:40]
    out["long_lp"] = [once(prompt=long_ids, temperature=0, echo=True, logprobs=1,
                           max_tokens=2).choices[0].logprobs.token_logprobs for _ in range(2)]
    # A streamed echo with logprobs: the first chunk carries the prompt and its tokens.
    first = None
    for chunk in once(prompt=prompt_ids, temperature=0, echo=True, logprobs=2, stream=True):
        if chunk.choices and first is None:
            first = chunk.choices[0].logprobs.token_logprobs
    out["stream_first_lp"] = first
    # lm-evaluation-harness's log-likelihood form: max_tokens 0 with echo, the prompt alone.
    r = once(prompt=prompt_ids, temperature=0, echo=True, logprobs=1, max_tokens=0)
    out["echo_only"] = {"lp": lp(r.choices[0]), "finish": r.choices[0].finish_reason,
                        "completion_tokens": r.usage.completion_tokens}
    print(json.dumps(out))


def disconnect_mid_stream(cl, prompt_ids):
    """Opens a long stream, reads two events, closes the socket; returns events read."""
    body = json.dumps({"prompt": prompt_ids, "max_tokens": 4000, "temperature": 0,
                       "stream": True, "ignore_eos": True}).encode()
    s = socket.create_connection((cl.host, cl.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    buf = b""
    while buf.count(b"data: ") < 3:
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
    s.close()
    return buf.count(b"data: ")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duet")
    ap.add_argument("--make-model")
    ap.add_argument("--work")
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--client-choices", help=argparse.SUPPRESS)
    ap.add_argument("--prompt-ids", help=argparse.SUPPRESS)
    ap.add_argument("--gen-ids", help=argparse.SUPPRESS)
    ap.add_argument("--eos-id", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--max-tokens", type=int, default=12)
    a = ap.parse_args()
    if a.client:
        client_main(a.client, [int(x) for x in a.prompt_ids.split(",")], a.max_tokens,
                    [int(x) for x in a.gen_ids.split(",")], a.eos_id)
        return 0
    if a.client_choices:
        choices_main(a.client_choices, [int(x) for x in a.prompt_ids.split(",")], a.max_tokens,
                     [int(x) for x in a.gen_ids.split(",")])
        return 0

    os.makedirs(a.work, exist_ok=True)
    py = ensure_venv(a.work)
    sys.path.insert(0, openai_lib.venv_site_packages(a.work))
    model = os.path.join(a.work, "tiny")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([a.make_model, "--preset", "tiny", "--seed", "3", "--out", model],
                       check=True)
    # The reference: the same greedy generation in one process.
    ref = json.loads(subprocess.run(
        [a.duet, "generate", "--model", model, "--prompt", "Hello, duet", "--max-tokens",
         str(a.max_tokens), "--temperature", "0", "--threads", "1", "--json"],
        check=True, capture_output=True, text=True).stdout)
    prompt_ids = ref["prompt_ids"]

    cl = Cluster(a.duet, model)
    try:
        base = "http://%s:%d" % (cl.host, cl.port)
        st, _, body = cl.request("GET", "/health")
        check(st == 200 and json.loads(body)["status"] == "ok", "GET /health is 200 when ready")
        before = samples(fetch(base + "/metrics"))

        # ---- The official openai client.
        with open(os.path.join(model, "config.json")) as f:
            eos = json.load(f)["eos_token_id"]
        eos = eos[0] if isinstance(eos, list) else eos
        out = run_child([py, os.path.abspath(__file__), "--client", base, "--prompt-ids",
                         ",".join(map(str, prompt_ids)), "--max-tokens", str(a.max_tokens),
                         "--gen-ids", ",".join(map(str, ref["generated_ids"])),
                         "--eos-id", str(eos)])
        check(out["text"] == ref["text"],
              "streamed completion is token-exact vs duet generate (%r)" % out["text"])
        check(out["whole_text"] == ref["text"], "non-streamed completion matches too")
        # Repeated prompts: every full block of 16 but the last token's comes from the cache.
        for key, n in (("whole_cached", len(prompt_ids)), ("chat_whole_cached", None)):
            if n is None:
                n = out["chat_usage"][0] if out["chat_usage"] else 0
            want_cached = (n - 1) // 16 * 16
            check(out[key] == want_cached,
                  "repeated %d-token prompt: usage.prompt_tokens_details.cached_tokens is %s "
                  "(want %d)" % (n, out[key], want_cached))
        check(out["usage"][0] == len(prompt_ids) and
              out["usage"][1] == len(ref["generated_ids"]) and
              out["usage"][2] == out["usage"][0] + out["usage"][1],
              "usage in the include_usage chunk: %s" % out["usage"])
        check(out["finish"] in ("length", "stop"), "finish_reason %s" % out["finish"])
        check(out["roles"] == ["assistant"], "chat stream: one role delta")
        check(out["chat_finish"] in ("length", "stop") and out["chat_usage"] and
              0 < out["chat_usage"][1] <= 8, "chat stream finished with usage %s" %
              out["chat_usage"])
        check(out["chat"] == out["chat_whole"], "chat: streamed == non-streamed (greedy)")
        check(out["bad_request_status"] == 400, "openai.BadRequestError for max_tokens")
        try:
            json_answer = json.loads(out["json_mode"][0])
        except ValueError:
            json_answer = None
        check(isinstance(json_answer, dict) and out["json_mode"][1] == "stop",
              "response_format json_object: a JSON object (%s)" % out["json_mode"])
        for field, got in out["refused"].items():
            check(got == [400, field, "unsupported"],
                  "%s: refused with 400 naming it (got %s)" % (field, got))
        check(len(out["refused"]) == 5, "five unimplemented fields tried: %s" % list(out["refused"]))
        check(out["auto_tools"][:3] == [400, "tool_choice", "unsupported"] and
              "--enable_auto_tool_choice" in out["auto_tools"][3],
              "tools without the server's auto tool choice: a 400 naming the flags (%s)" %
              out["auto_tools"])
        check(out["tool_role"] == [400, "messages"],
              "a tool message on a template without tools is a 400 (%s)" % out["tool_role"])
        check(out["capped_tokens"] == 3, "max_completion_tokens 3 wins over max_tokens 8 (%s)" %
              out["capped_tokens"])
        check(out["stop_ids"][0] == "stop" and out["stop_ids"][1] == out["stop_ids"][2],
              "stop_token_ids ends the greedy output at its first stop id: %s" % out["stop_ids"])
        # ---- /tokenize, /detokenize and /version, in vLLM's shapes.
        st, _, body = cl.request("POST", "/tokenize", body={"prompt": "Hello, duet"})
        tk = json.loads(body)
        check(st == 200 and tk["tokens"] == prompt_ids and tk["count"] == len(prompt_ids),
              "/tokenize gives the ids a completion is prefilled with (%s)" % tk)
        st, _, body = cl.request("POST", "/detokenize", body={"tokens": ref["generated_ids"]})
        check(st == 200 and json.loads(body)["prompt"] == ref["text"],
              "/detokenize gives the text of the ids")
        st, _, body = cl.request("GET", "/version")
        check(st == 200 and json.loads(body).get("version"), "/version answers %s" % body)
        # ---- Sampling parameters through the client.
        smp, gen = out["sampling"], ref["generated_ids"]
        k, banned = smp["k"], smp["banned"]["text"]
        check(banned[:k] == ref["text"][:k] and chr(gen[k]) not in banned,
              "logit_bias -100 on greedy token %d (%r) removes it: %r vs %r" %
              (k, chr(gen[k]), banned, ref["text"]))
        check(smp["min_p1"]["text"] == ref["text"],
              "min_p 1 at temperature 1.5 equals greedy: %r" % smp["min_p1"]["text"])
        check(smp["eos_now"]["tokens"] == 1 and smp["eos_now"]["finish"] == "stop",
              "EOS biased +100 ends at once: %s" % smp["eos_now"])
        check(smp["eos_min5"]["tokens"] == 6 and smp["eos_min5"]["finish"] == "stop",
              "min_tokens 5 holds EOS back for 5 tokens: %s" % smp["eos_min5"])
        for p in smp["penalised"]:
            check(p["text"] != smp["plain60"]["text"],
                  "a penalty changes the greedy text: %r" % p["text"])
        check(smp["penalised_again"] == smp["penalised"][0], "penalised greedy is deterministic")
        check(smp["bad_bias_id"] == [400, "logit_bias"],
              "logit_bias with a token id outside the vocabulary is a 400: %s" %
              smp["bad_bias_id"])
        check(smp["bad_repetition"] == [400, "repetition_penalty"],
              "repetition_penalty 0 is a 400 naming it: %s" % smp["bad_repetition"])
        check(smp["bad_min_tokens"] == [400, "min_tokens"],
              "min_tokens above max_tokens is a 400 naming it: %s" % smp["bad_min_tokens"])
        check(out["top1_text"] == out["whole_text"],
              "top_k 1 at temperature 1.5 equals greedy: %r vs %r" %
              (out["top1_text"], out["whole_text"]))

        # ---- A `stop` string ends the request early; it counts as ok, not cancelled.
        gen = ref["generated_ids"]
        k = next(i for i in range(2, len(gen))
                 if 32 < gen[i] < 127 and gen[i] not in gen[:i])
        st, _, payload = cl.request("POST", "/v1/completions", body={
            "prompt": prompt_ids, "max_tokens": 200, "temperature": 0, "ignore_eos": True,
            "stop": chr(gen[k])})
        stopped = json.loads(payload)
        check(st == 200 and stopped["choices"][0]["finish_reason"] == "stop" and
              stopped["usage"]["completion_tokens"] <= k + 1,
              "stop string %r ended the completion after %s tokens" %
              (chr(gen[k]), stopped.get("usage")))

        # ---- Malformed requests through curl, as a user would meet them.
        check(shutil.which("curl") is not None, "curl is installed (scripts/install_deps.sh)")
        big = os.path.join(a.work, "big_body.json")
        with open(big, "w") as f:
            f.write("{\"prompt\": \"" + "a" * (2 << 20) + "\"}")
        for what, data, status, param, code in [
                ("a malformed JSON body", "{\"prompt\": ", 400, None, "invalid_json"),
                ("a wrong-typed field", json.dumps({"prompt": "hi", "max_tokens": "lots"}), 400,
                 "max_tokens", "invalid_type"),
                ("an oversized body", "@" + big, 413, None, None)]:
            st, err = curl_error(base + "/v1/completions", data)
            ok = (st == status and isinstance(err, dict) and
                  set(err) >= {"message", "type", "param", "code"} and err["message"] and
                  err["type"] and (param is None or err["param"] == param) and
                  (code is None or err["code"] == code))
            check(ok, "curl with %s -> %s %s" % (what, st, err))

        # ---- Malformed requests get OpenAI errors.
        def expect_error(path, status, raw=None, body=None, param=None, code=None, headers=None):
            st, hdrs, payload = cl.request("POST", path, body=body, raw=raw, headers=headers)
            err = json.loads(payload)["error"]
            ok = st == status and err["message"] and err["type"]
            if param is not None:
                ok = ok and err["param"] == param
            if code is not None:
                ok = ok and err["code"] == code
            check(ok, "%s %s -> %d %s (%s)" % (path, (raw or json.dumps(body))[:60], st,
                                              err.get("code"), err["message"][:60]))
            return hdrs
        expect_error("/v1/completions", 400, raw="{\"prompt\": ", code="invalid_json")
        expect_error("/v1/completions", 400, raw="[]", code="invalid_json")
        expect_error("/v1/completions", 400, body={"prompt": "hi", "max_tokens": "lots"},
                     param="max_tokens", code="invalid_type")
        expect_error("/v1/completions", 400, body={"prompt": "hi", "temperature": [1]},
                     param="temperature")
        expect_error("/v1/completions", 400, body={"prompt": "hi", "max_tokens": 0},
                     param="max_tokens")
        expect_error("/v1/completions", 400, body={"prompt": "hi", "n": 129}, param="n")
        expect_error("/v1/completions", 400, body={"max_tokens": 3}, param="prompt")
        expect_error("/v1/chat/completions", 400, body={"messages": "hi"}, param="messages")
        st, _, models = cl.request("GET", "/v1/models")
        ctx = json.loads(models)["data"][0]["max_model_len"]
        expect_error("/v1/completions", 400, body={"prompt": [5] * ctx, "max_tokens": 1},
                     code="context_length_exceeded")
        expect_error("/v1/completions", 400, body={"prompt": [5, 6], "max_tokens": ctx},
                     param="max_tokens", code="context_length_exceeded")
        expect_error("/v1/completions", 413, raw="{\"prompt\": \"" + "a" * (2 << 20) + "\"}")
        st, _, payload = cl.request("GET", "/v1/nothing")
        check(st == 404 and "error" in json.loads(payload), "unknown route -> 404 error body")

        # ---- Metrics moved as expected.
        after = samples(fetch(base + "/metrics"))
        ok_delta = (value(after, "duet_coordinator_requests_total", outcome="ok") -
                    value(before, "duet_coordinator_requests_total", outcome="ok"))
        check(ok_delta == 18, "coordinator requests_total{outcome=ok} moved by 18, the usage, "
              "top_k, sampling-parameter (8), max_completion_tokens, stop_token_ids, JSON-mode "
              "and stop-string requests included (%s)" % ok_delta)
        cancelled_delta = (value(after, "duet_coordinator_requests_total", outcome="cancelled") -
                           value(before, "duet_coordinator_requests_total", outcome="cancelled"))
        check(cancelled_delta == 0, "no request counted as cancelled (%s)" % cancelled_delta)
        ttft = (value(after, "duet_coordinator_ttft_seconds_count") -
                value(before, "duet_coordinator_ttft_seconds_count"))
        check(ttft == 18, "TTFT histogram counted 18 requests (%s)" % ttft)
        e2e = (value(after, "duet_coordinator_e2e_seconds_count") -
               value(before, "duet_coordinator_e2e_seconds_count"))
        check(e2e == 18, "e2e histogram counted 18 requests (the bad logit_bias id is refused "
              "before any backend) (%s)" % e2e)
        check(value(after, "duet_http_requests_total", path="/v1/completions", code="400") >= 8,
              "HTTP 400s counted by path")
        check(value(after, "duet_coordinator_nodes", kind="decode") == 1, "node gauge: 1 decode")
        # The same requests under vLLM's names (what a vLLM Grafana dashboard reads).
        mn = os.path.basename(model)
        vttft = (value(after, "vllm:time_to_first_token_seconds_count", model_name=mn) -
                 value(before, "vllm:time_to_first_token_seconds_count", model_name=mn))
        check(vttft == ttft, "vllm:time_to_first_token_seconds counted the %s requests (%s)" %
              (ttft, vttft))
        vgen = (value(after, "vllm:generation_tokens_total", model_name=mn) -
                value(before, "vllm:generation_tokens_total", model_name=mn))
        gen = (value(after, "duet_coordinator_generated_tokens_total") -
               value(before, "duet_coordinator_generated_tokens_total"))
        check(vgen == gen and gen > 0, "vllm:generation_tokens_total moved with duet's (%s, %s)" %
              (vgen, gen))
        vok = sum(value(after, "vllm:request_success_total", model_name=mn, finished_reason=r) -
                  value(before, "vllm:request_success_total", model_name=mn, finished_reason=r)
                  for r in ("stop", "length"))
        check(vok == ok_delta, "vllm:request_success_total counted the %s finished requests (%s)"
              % (ok_delta, vok))
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                     "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
                     "vllm:inter_token_latency_seconds_count",
                     "vllm:time_per_output_token_seconds_count",
                     "vllm:e2e_request_latency_seconds_count",
                     "vllm:request_queue_time_seconds_count",
                     "vllm:request_prefill_time_seconds_count",
                     "vllm:request_decode_time_seconds_count"):
            check((name, frozenset({("model_name", mn)})) in after, name + " is exported")
        check(0 <= value(after, "vllm:kv_cache_usage_perc", model_name=mn) <= 1,
              "vllm:kv_cache_usage_perc is a fraction")
        check(value(after, "duet_coordinator_node_heartbeats_total", node="decode-0") > 0,
              "heartbeats counted")
        dec = samples(fetch(cl.metrics["decode-0"]))
        pre = samples(fetch(cl.metrics["prefill-0"]))
        check(value(dec, "duet_decode_requests_admitted_total") >= 4, "decode admitted >= 4")
        check(value(dec, "duet_decode_layer_transfer_seconds_count") > 0,
              "per-layer transfer latency histogram on the decode node")
        check(value(pre, "duet_prefill_kv_transfer_bytes_total") > 0, "prefill KV bytes counted")
        check(value(pre, "duet_prefill_requests_total", outcome="ok") >= 4, "prefill ok >= 4")
        total = value(dec, "duet_decode_kv_blocks", state="total")
        # Free or cached-evictable (finished requests' blocks stay in the prefix cache).
        check(total > 0 and reusable(dec) == total,
              "every decode KV block free or evictable at rest (%s)" % total)

        # ---- A client that disconnects mid-stream frees every block.
        base_cancel = value(after, "duet_coordinator_requests_total", outcome="cancelled")
        base_tokens = value(dec, "duet_decode_generated_tokens_total")
        got = disconnect_mid_stream(cl, prompt_ids)
        check(got >= 1, "read %d events before disconnecting" % got)
        deadline = time.time() + 30
        while time.time() < deadline:
            m = samples(fetch(base + "/metrics"))
            d = samples(fetch(cl.metrics["decode-0"]))
            if (value(m, "duet_coordinator_requests_total", outcome="cancelled") > base_cancel
                    and reusable(d) == total
                    and value(m, "duet_coordinator_active_requests") == 0):
                break
            time.sleep(0.2)
        check(value(m, "duet_coordinator_requests_total", outcome="cancelled") == base_cancel + 1,
              "the disconnected request was cancelled (requests: %s)" %
              {k[1] and dict(k[1]).get("outcome"): v for k, v in m.items()
               if k[0] == "duet_coordinator_requests_total"})
        check(value(m, "duet_http_client_disconnects_total") >= 1, "disconnect counted")
        check(reusable(d) == total and
              value(d, "duet_decode_kv_blocks", state="quarantined") == 0,
              "every decode KV block came back after the disconnect")
        generated = value(d, "duet_decode_generated_tokens_total") - base_tokens
        check(generated < 3999, "the cancelled request stopped early (%d of 4000 tokens)"
              % generated)
        st, _, _ = cl.request("GET", "/health")
        check(st == 200, "still healthy")

        # ---- n, seeds per choice, a list of prompts and echo, through the openai client.
        ch = run_child([py, os.path.abspath(__file__), "--client-choices", base, "--prompt-ids",
                        ",".join(map(str, prompt_ids)), "--max-tokens", str(a.max_tokens),
                        "--gen-ids", ",".join(map(str, ref["generated_ids"]))])
        check(ch["n3_index"] == [0, 1, 2], "n=3: choices indexed 0, 1, 2 (%s)" % ch["n3_index"])
        check(ch["n3"] == ch["n3_singles"],
              "n=3 with seed 7: choice j is the n=1 request with seed 7+j (%s)" % ch["n3"])
        check(len(set(ch["n3"])) == 3, "the three seeded choices differ")
        check(ch["n3_stream"] == ch["n3"] and None not in ch["n3_stream_finishes"],
              "streamed n=3, reassembled by index, equals the non-streamed choices, each with "
              "its finish reason (%s)" % ch["n3_stream_finishes"])
        check(ch["n3_usage"][0] == len(prompt_ids),
              "usage counts the prompt once for its n choices (%s)" % ch["n3_usage"])
        check(ch["unseeded"][0] != ch["unseeded"][1] and
              ch["unseeded_singles"][0] != ch["unseeded_singles"][1],
              "without a seed every choice and every request draws its own")
        check(ch["chat_n2"] == [out["chat_whole"]] * 2,
              "chat n=2 at temperature 0: both choices are the greedy answer")
        ref_text = ref["text"]
        check(ch["batch_index"] == [0, 1, 2, 3] and
              ch["batch"] == [ref_text, ref_text, ch["other_single"], ch["other_single"]],
              "a list of 2 prompts with n=2: choices prompt-major, each its prompt's greedy text")
        check(ch["batch_usage"][0] == len(prompt_ids) + ch["other_len"],
              "a list of prompts: usage.prompt_tokens sums the prompts (%s)" % ch["batch_usage"])
        check(ch["echo"] == ["Hello, duet" + ref_text] * 2,
              "echo: each choice starts with its prompt (%r)" % ch["echo"])
        n_prompt, n_gen = len(prompt_ids), len(ref["generated_ids"])
        e = ch["echo_lp"]
        check(len(e["tokens"]) == n_prompt + n_gen and e["lps"][0] is None and
              e["tops"][0] is None and all(isinstance(x, float) for x in e["lps"][1:]),
              "echo with logprobs: %d prompt tokens (the first with null) then %d output tokens"
              % (n_prompt, n_gen))
        check(e["lps"][n_prompt:] == ch["gen_lp"],
              "echo with logprobs: the output's logprobs are those of the same request without "
              "echo")
        check(all(len(t) == 2 for t in e["tops"][1:]), "two alternatives at every scored token")
        check(e["offsets"][0] == 0 and e["offsets"] == sorted(e["offsets"]),
              "text offsets start at 0 and never decrease: %s" % e["offsets"])
        check(ch["forced_lp"][n_prompt:n_prompt + n_gen - 1] == ch["gen_lp"][:n_gen - 1],
              "teacher forcing: the greedy output sent as a prompt is scored exactly as it was "
              "generated (%s vs %s)" % (ch["forced_lp"][n_prompt:], ch["gen_lp"]))
        check(ch["long_lp"][0] == ch["long_lp"][1] and ch["long_lp"][0][0] is None and
              all(isinstance(x, float) for x in ch["long_lp"][0][1:]),
              "a prompt in the prefix cache is still scored whole, the same")
        check([c["lps"][:n_prompt] for c in ch["echo_lp_n2"]] == [e["lps"][:n_prompt]] * 2,
              "n=2: both choices carry the prompt's logprobs")
        eo = ch["echo_only"]
        check(eo["lp"]["lps"] == e["lps"][:n_prompt] and eo["finish"] == "length" and
              eo["completion_tokens"] == 0 and len(eo["lp"]["tokens"]) == n_prompt,
              "max_tokens 0 with echo: the prompt alone, scored as with a completion (%s)" % eo)
        check(ch["stream_first_lp"] is not None and
              ch["stream_first_lp"][:n_prompt] == e["lps"][:n_prompt],
              "streamed: the first chunk carries the prompt's logprobs")

        # ---- The choices of a prompt share its KV: computed, sent and held once.
        # 2 full blocks of 16 can be shared; a prompt no earlier request began with.
        long_ids = (list(reversed(prompt_ids)) * 4)[:40]
        m0 = samples(fetch(base + "/metrics"))
        d0 = samples(fetch(cl.metrics["decode-0"]))
        p0 = samples(fetch(cl.metrics["prefill-0"]))
        st, _, payload = cl.request("POST", "/v1/completions", body={
            "prompt": long_ids, "max_tokens": 4, "temperature": 0, "n": 3, "ignore_eos": True})
        shared = json.loads(payload)
        check(st == 200 and len({c["text"] for c in shared["choices"]}) == 1,
              "n=3 greedy on a 40-token prompt: three equal choices")
        m1 = samples(fetch(base + "/metrics"))
        d1 = samples(fetch(cl.metrics["decode-0"]))
        p1 = samples(fetch(cl.metrics["prefill-0"]))
        sib = (value(m1, "duet_coordinator_routing_decisions_total", reason="sibling") -
               value(m0, "duet_coordinator_routing_decisions_total", reason="sibling"))
        check(sib == 2, "the 2 later choices were routed to the first one's nodes (%s)" % sib)
        dh = (value(d1, "duet_decode_prefix_cache_hits_total") -
              value(d0, "duet_decode_prefix_cache_hits_total"))
        ph = (value(p1, "duet_prefill_prefix_cache_hits_total") -
              value(p0, "duet_prefill_prefix_cache_hits_total"))
        check(dh == 64 and ph == 64,
              "each later choice took the prompt's 32 shareable tokens from the decode node's "
              "and the prefill node's caches (decode %s, prefill %s)" % (dh, ph))
    finally:
        cl.stop()
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
