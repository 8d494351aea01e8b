#!/usr/bin/env python3
"""Structured output through the official `openai` client, as agent frameworks send it.

Starts `duet serve --loopback` with 2 prefill and 2 decode nodes and `duet serve --colocated` (one
process), both on the tiny synthetic model (127.0.0.1 only), then, in a venv with `openai` and
`jsonschema`:
  - 20 JSON schemas of growing complexity (nested objects, arrays with bounds, enums, required
    fields, string patterns and lengths, numbers and integers with ranges, anyOf, const) through
    `response_format: json_schema`, greedy and sampled: every answer parses and validates
    against its schema (jsonschema), ends with finish_reason "stop", and the cluster's answer is
    the colocated server's, character for character (the cluster samples what one process does);
  - streamed deltas put together are the non-streamed answer;
  - the client's Pydantic helper (`chat.completions.parse`, `beta.` in older clients) returns
    the parsed object;
  - vLLM's `structured_outputs` regex and choice, and an invalid schema refused with a 400.
Exit 77 (ctest SKIP) when the venv cannot be created or the packages cannot be installed.

  structured_output_api_test.py --duet build/cli/duet --make-model build/cli/duet-make-model \
      --work DIR
"""
import argparse
import json
import os
import subprocess
import sys

import openai_lib

MAX_TOKENS = 600


def log(*a):
    print("[structured_output_api_test]", *a, flush=True)


def S(max_len=12):
    return {"type": "string", "maxLength": max_len}


SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["n"]},
    {"type": "object", "properties": {"name": S(), "age": {"type": "integer", "minimum": 0,
                                                           "maximum": 150}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
     "required": ["color"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
     "required": ["code"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S(8), "minItems": 1,
                                               "maxItems": 3}},
     "required": ["tags"]},
    {"type": "object", "properties": {"score": {"type": "integer", "minimum": -5, "maximum": 5},
                                      "label": S(6)},
     "required": ["score", "label"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                         "y": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["x", "y"]}}, "required": ["point"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2,
     "maxItems": 4},
    {"type": "object", "properties": {"kind": {"const": "user"}, "id": {"type": "integer",
                                                                       "minimum": 1,
                                                                       "maximum": 1000}},
     "required": ["kind", "id"]},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0,
                                                       "maximum": 9}, {"type": "boolean"}]}},
     "required": ["v"]},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"sku": S(5), "qty": {"type": "integer", "minimum": 1,
                                                              "maximum": 9}},
        "required": ["sku", "qty"]}}}, "required": ["items"]},
    {"type": "object", "properties": {"status": {"enum": ["open", "closed"]},
                                      "priority": {"enum": [1, 2, 3]}},
     "required": ["status", "priority"]},
    {"type": "object", "properties": {"date": {"type": "string",
                                               "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}},
     "required": ["date"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": S(), "email": {"type": "string", "pattern": "^[a-z]{1,6}@[a-z]{1,6}\\.com$"}},
        "required": ["name", "email"]}, "active": {"type": "boolean"}},
     "required": ["user", "active"]},
    {"type": "object", "properties": {"matrix": {"type": "array", "minItems": 2, "maxItems": 2,
                                                 "items": {"type": "array", "minItems": 2,
                                                           "maxItems": 2,
                                                           "items": {"type": "integer",
                                                                     "minimum": 0,
                                                                     "maximum": 9}}}},
     "required": ["matrix"]},
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 6},
                                      "nick": {"type": ["string", "null"], "maxLength": 6}},
     "required": ["name", "nick"]},
    {"type": "object", "properties": {"event": {"type": "object", "properties": {
        "type": {"enum": ["click", "view"]},
        "at": {"type": "integer", "minimum": 0, "maximum": 86400},
        "meta": {"type": "object", "properties": {"ref": S(6)}, "required": ["ref"]}},
        "required": ["type", "at", "meta"]}}, "required": ["event"]},
    {"type": "object", "properties": {
        "a": {"type": "boolean"}, "b": {"type": "integer", "minimum": 0, "maximum": 3},
        "c": {"enum": ["x", "y"]}, "d": S(4), "e": {"type": "array", "maxItems": 2,
                                                    "items": {"type": "boolean"}}},
     "required": ["a", "b", "c", "d", "e"], "additionalProperties": False},
    {"type": "object", "properties": {"order": {"type": "object", "properties": {
        "id": {"type": "string", "pattern": "^ord_[0-9]{4}$"},
        "lines": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
            "type": "object", "properties": {"sku": {"enum": ["A1", "B2"]},
                                             "qty": {"type": "integer", "minimum": 1,
                                                     "maximum": 5}},
            "required": ["sku", "qty"], "additionalProperties": False}},
        "paid": {"type": "boolean"}}, "required": ["id", "lines", "paid"]}},
     "required": ["order"]},
]


def client_main(urls, out_path):
    """Runs inside the venv: the official openai client against both servers."""
    import jsonschema
    import openai
    import pydantic

    clients = [openai.OpenAI(base_url=u + "/v1", api_key="unused", max_retries=0) for u in urls]
    models = [c.models.list().data[0].id for c in clients]
    messages = [{"role": "user", "content": "Give me the record."}]
    out = {"schemas": [], "stream": None, "parsed": None, "regex": [], "choice": [],
           "invalid": None}
    for i, schema in enumerate(SCHEMAS):
        for temperature in (0.0, 1.0):
            answers = []
            for c, m in zip(clients, models):
                r = c.chat.completions.create(
                    model=m, messages=messages, max_tokens=MAX_TOKENS, temperature=temperature,
                    seed=100 + i, response_format={"type": "json_schema", "json_schema": {
                        "name": "record_%d" % i, "schema": schema}})
                answers.append([r.choices[0].message.content, r.choices[0].finish_reason])
            valid = None
            try:
                jsonschema.validate(json.loads(answers[0][0]), schema)
                valid = True
            except (ValueError, jsonschema.ValidationError) as e:
                valid = str(e)[:300]
            out["schemas"].append({"i": i, "temperature": temperature, "answers": answers,
                                   "valid": valid})
    # Streamed on the cluster: the deltas put together.
    stream = clients[0].chat.completions.create(
        model=models[0], messages=messages, max_tokens=MAX_TOKENS, temperature=1.0, seed=7,
        stream=True, response_format={"type": "json_schema", "json_schema": {
            "name": "r", "schema": SCHEMAS[19]}})
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    whole = clients[0].chat.completions.create(
        model=models[0], messages=messages, max_tokens=MAX_TOKENS, temperature=1.0, seed=7,
        response_format={"type": "json_schema", "json_schema": {"name": "r",
                                                                "schema": SCHEMAS[19]}})
    out["stream"] = [text, whole.choices[0].message.content]

    # The client's Pydantic helper.
    class Item(pydantic.BaseModel):
        sku: str = pydantic.Field(max_length=6)
        qty: int = pydantic.Field(ge=1, le=9)

    class Order(pydantic.BaseModel):
        id: int = pydantic.Field(ge=0, le=9999)
        items: list[Item] = pydantic.Field(max_length=2)
        paid: bool

    parse = getattr(clients[0].chat.completions, "parse", None)
    if parse is None:
        parse = clients[0].beta.chat.completions.parse
    parsed = parse(model=models[0], messages=messages, max_tokens=MAX_TOKENS, temperature=1.0,
                   seed=3, response_format=Order)
    p = parsed.choices[0].message.parsed
    out["parsed"] = {"type": type(p).__name__, "value": p.model_dump() if p else None}

    # vLLM's structured_outputs (regex, choice), through extra_body as vLLM users send them.
    for c, m in zip(clients, models):
        r = c.completions.create(model=m, prompt="Code:", max_tokens=40, temperature=1.0, seed=1,
                                 extra_body={"structured_outputs": {"regex": "[a-f]{3}-[0-9]{4}"}})
        out["regex"].append(r.choices[0].text)
        r = c.chat.completions.create(model=m, messages=messages, max_tokens=10, temperature=1.0,
                                      seed=2, extra_body={"structured_outputs": {
                                          "choice": ["yes", "no", "maybe"]}})
        out["choice"].append(r.choices[0].message.content)
    try:
        clients[0].chat.completions.create(
            model=models[0], messages=messages, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {
                "name": "bad", "schema": {"type": "object", "properties": {
                    "x": {"type": "no-such-type"}}}}})
    except openai.BadRequestError as e:
        out["invalid"] = [e.status_code, str(e)[:300]]
    with open(out_path, "w") as f:
        json.dump(out, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duet")
    ap.add_argument("--make-model")
    ap.add_argument("--work")
    ap.add_argument("--client", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        client_main(a.client, a.out)
        return 0

    os.makedirs(a.work, exist_ok=True)
    py = openai_lib.ensure_venv(a.work, ["openai", "jsonschema"], log)
    model = os.path.join(a.work, "tiny")
    if not os.path.exists(os.path.join(model, "config.json")):
        subprocess.run([a.make_model, "--preset", "tiny", "--seed", "3", "--out", model],
                       check=True)
    common = ["--model=" + model, "--threads=1", "--kv_cache_bytes=16777216", "--http_port=0"]
    servers = []
    check = openai_lib.Checks(log)
    try:
        servers.append(openai_lib.Server(a.duet, ["--loopback", "--prefill=2", "--decode=2",
                                                  "--transport=shm"] + common))
        servers.append(openai_lib.Server(a.duet, ["--colocated"] + common))
        out = openai_lib.run_client(py, __file__, [servers[0].http, servers[1].http], a.work)

        for s in out["schemas"]:
            (cluster, cl_finish), (colocated, co_finish) = s["answers"]
            what = "schema %d at temperature %s" % (s["i"], s["temperature"])
            check(s["valid"] is True, "%s: the 2P/2D answer validates (%s: %r)" %
                  (what, s["valid"], cluster))
            check(cl_finish == "stop" and co_finish == "stop",
                  "%s: finish_reason stop (%s, %s)" % (what, cl_finish, co_finish))
            check(cluster == colocated, "%s: 2P/2D answers what one process does (%r vs %r)" %
                  (what, cluster, colocated))
        check(len(out["schemas"]) == 40, "20 schemas, greedy and sampled")
        check(out["stream"][0] == out["stream"][1],
              "streamed deltas put together are the answer (%r vs %r)" % tuple(out["stream"]))
        check(out["parsed"]["type"] == "Order" and out["parsed"]["value"] is not None,
              "the Pydantic helper returns the parsed object (%s)" % out["parsed"])
        import re
        check(all(re.fullmatch("[a-f]{3}-[0-9]{4}", t) for t in out["regex"]) and
              out["regex"][0] == out["regex"][1],
              "structured_outputs regex, the same on both (%s)" % out["regex"])
        check(out["choice"][0] in ("yes", "no", "maybe") and out["choice"][0] == out["choice"][1],
              "structured_outputs choice, the same on both (%s)" % out["choice"])
        check(out["invalid"] is not None and out["invalid"][0] == 400,
              "an invalid schema is a 400 (%s)" % out["invalid"])
    finally:
        for s in servers:
            s.stop()
    return check.result()


if __name__ == "__main__":
    sys.exit(main())
