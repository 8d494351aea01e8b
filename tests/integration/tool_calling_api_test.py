#!/usr/bin/env python3
"""Tool calling through the official `openai` client, as agent frameworks send it.

Serves SmolLM2-135M-Instruct (models/smollm2-135m-instruct-q4_1.gguf; exit 77, ctest's SKIP,
without it or without PyPI) on 127.0.0.1 twice: `duet serve --loopback` with 2 prefill and 2
decode nodes, `--enable_auto_tool_choice --tool_call_parser hermes` and a ChatML template with
Hermes tool calling (testdata/chatml_hermes_tools.jinja: SmolLM2's own template renders no
tools), and `duet serve --colocated` with the same template but without auto tool choice. Then:
  - tool_choice "required" and a named function, greedy and sampled: the calls name a given tool
    and their arguments validate against its parameters (jsonschema); finish_reason tool_calls
    (stop for a named function, as OpenAI); content null; the cluster's calls are the colocated
    server's, character for character;
  - tool_choice "auto" with a conversation whose earlier turn called the tool: the model calls it
    again, and the reply carries parsed tool_calls, with no <tool_call> text left in content;
  - for each, the streamed deltas put together (content, and each call's id, name and argument
    pieces by index) are the non-streamed reply;
  - a conversation that carries the tool's result back (an assistant message with tool_calls and
    a tool message) is rendered and answered;
  - "auto" on the server without --enable_auto_tool_choice is a 400 naming the flags, and a
    template-less tool role (tools on a model whose template renders none) is a 400 too.

  tool_calling_api_test.py --duet build/cli/duet --source-dir . --work DIR
"""
import argparse
import json
import os
import sys

import openai_lib

MODEL = "models/smollm2-135m-instruct-q4_1.gguf"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the local time in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
        },
    },
}
TOOLS = [WEATHER, TIME]


def weather_call(city, i):
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_%d" % i, "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": city, "unit": "celsius"})}}]}


# Earlier turns called the tool: the model sees the format in use (SmolLM2-135M then calls it
# for the next city, greedy).
HISTORY = [
    {"role": "system", "content": "You are a helpful assistant that calls tools."},
    {"role": "user", "content": "Weather in Paris?"}, weather_call("Paris", 1),
    {"role": "user", "content": "Weather in Rome?"}, weather_call("Rome", 2),
    {"role": "user", "content": "Weather in London?"},
]


def log(*a):
    print("[tool_calling_api_test]", *a, flush=True)


def message_of(m):
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
             for c in (m.tool_calls or [])]
    return {"content": m.content, "calls": calls}


def streamed(stream):
    """The deltas put together, as a client of the stream does."""
    content, calls, finish = None, {}, None
    for ch in stream:
        if not ch.choices:
            continue
        c = ch.choices[0]
        if c.delta.content:
            content = (content or "") + c.delta.content
        for t in c.delta.tool_calls or []:
            call = calls.setdefault(t.index, {"id": None, "name": None, "arguments": ""})
            if t.id:
                call["id"] = t.id
            if t.function and t.function.name:
                call["name"] = t.function.name
            if t.function and t.function.arguments:
                call["arguments"] += t.function.arguments
        if c.finish_reason:
            finish = c.finish_reason
    return {"content": content, "calls": [calls[i] for i in sorted(calls)]}, finish


def client_main(urls, out_path):
    """Runs inside the venv: the official openai client against both servers."""
    import openai

    clients = [openai.OpenAI(base_url=u + "/v1", api_key="unused", max_retries=0) for u in urls]
    models = [c.models.list().data[0].id for c in clients]
    ask = [{"role": "user", "content": "What is the weather in Berlin?"}]
    out = {"forced": [], "auto": None, "result_turn": None, "refused": []}
    named = {"type": "function", "function": {"name": "get_time"}}
    for label, choice, finish_want in (("required", "required", "tool_calls"),
                                       ("named", named, "stop")):
        for temperature in (0.0, 1.0):
            kw = dict(messages=ask, tools=TOOLS, tool_choice=choice, max_tokens=120,
                      temperature=temperature, seed=11)
            replies = []
            for c, m in zip(clients, models):
                r = c.chat.completions.create(model=m, **kw)
                replies.append([message_of(r.choices[0].message), r.choices[0].finish_reason])
            s, s_finish = streamed(clients[0].chat.completions.create(
                model=models[0], stream=True, **kw))
            out["forced"].append({"label": label, "temperature": temperature, "replies": replies,
                                  "stream": [s, s_finish], "finish_want": finish_want})
    # auto, on the cluster only (the colocated server has it off).
    kw = dict(messages=HISTORY, tools=TOOLS, max_tokens=120, temperature=0.0)
    r = clients[0].chat.completions.create(model=models[0], **kw)
    s, s_finish = streamed(clients[0].chat.completions.create(model=models[0], stream=True, **kw))
    out["auto"] = {"reply": [message_of(r.choices[0].message), r.choices[0].finish_reason],
                   "stream": [s, s_finish]}
    # The tool's result carried back: the model answers in text.
    calls = r.choices[0].message.tool_calls or []
    if calls:
        turn = HISTORY + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": calls[0].id, "type": "function",
                 "function": {"name": calls[0].function.name,
                              "arguments": calls[0].function.arguments}}]},
            {"role": "tool", "tool_call_id": calls[0].id, "content": "12 degrees, rain"}]
        r2 = clients[0].chat.completions.create(model=models[0], messages=turn, tools=TOOLS,
                                                tool_choice="none", max_tokens=30,
                                                temperature=0.0)
        out["result_turn"] = message_of(r2.choices[0].message)
    # Refusals.
    for what, c, kw in (
            ("auto without --enable_auto_tool_choice", clients[1],
             dict(model=models[1], messages=ask, tools=TOOLS)),
            ("a named function not among the tools", clients[0],
             dict(model=models[0], messages=ask, tools=[WEATHER], tool_choice=named))):
        try:
            c.chat.completions.create(max_tokens=8, **kw)
            out["refused"].append([what, None, "accepted"])
        except openai.BadRequestError as e:
            out["refused"].append([what, e.status_code, str(e)[:300]])
    with open(out_path, "w") as f:
        json.dump(out, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duet")
    ap.add_argument("--source-dir")
    ap.add_argument("--work")
    ap.add_argument("--client", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        client_main(a.client, a.out)
        return 0

    model = os.path.join(a.source_dir, MODEL)
    if not os.path.exists(model):
        log("SKIP: %s is absent (scripts/get_model.sh smollm2 fetches it)" % MODEL)
        return openai_lib.SKIP
    os.makedirs(a.work, exist_ok=True)
    py = openai_lib.ensure_venv(a.work, ["openai", "jsonschema"], log)
    template = os.path.join(a.source_dir, "tests/integration/testdata/chatml_hermes_tools.jinja")
    common = ["--model=" + model, "--threads=1", "--kv_cache_bytes=33554432", "--http_port=0",
              "--chat_template=" + template]
    servers = []
    check = openai_lib.Checks(log)
    try:
        servers.append(openai_lib.Server(a.duet, [
            "--loopback", "--prefill=2", "--decode=2", "--transport=shm",
            "--enable_auto_tool_choice", "--tool_call_parser=hermes"] + common))
        servers.append(openai_lib.Server(a.duet, ["--colocated"] + common))
        out = openai_lib.run_client(py, __file__, [servers[0].http, servers[1].http], a.work)
        sys.path.insert(0, openai_lib.venv_site_packages(a.work))
        import jsonschema

        params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

        def valid_calls(msg, names):
            if not msg["calls"]:
                return "no calls"
            for c in msg["calls"]:
                if c["name"] not in names:
                    return "calls %s" % c["name"]
                try:
                    jsonschema.validate(json.loads(c["arguments"]), params[c["name"]])
                except (ValueError, jsonschema.ValidationError) as e:
                    return str(e)[:200]
            return True

        def same_calls(a, b):
            return a["content"] == b["content"] and [(c["name"], c["arguments"]) for c in
                                                     a["calls"]] == \
                [(c["name"], c["arguments"]) for c in b["calls"]]

        for f in out["forced"]:
            (cluster, finish), (colocated, co_finish) = f["replies"]
            what = "tool_choice %s at temperature %s" % (f["label"], f["temperature"])
            names = ["get_time"] if f["label"] == "named" else list(params)
            v = valid_calls(cluster, names)
            check(v is True, "%s: the calls validate against the tool's parameters (%s: %s)" %
                  (what, v, cluster))
            check(cluster["content"] is None, "%s: no content (%r)" % (what, cluster["content"]))
            check(finish == f["finish_want"] and co_finish == f["finish_want"],
                  "%s: finish_reason %s (%s, %s)" % (what, f["finish_want"], finish, co_finish))
            check(same_calls(cluster, colocated),
                  "%s: 2P/2D calls what one process does (%s vs %s)" % (what, cluster, colocated))
            s, s_finish = f["stream"]
            check(same_calls(s, cluster) and s_finish == finish and
                  all(c["id"] for c in s["calls"]),
                  "%s: the streamed deltas put together are the reply (%s, %s vs %s)" %
                  (what, s, s_finish, cluster))
        (auto, finish), (s, s_finish) = out["auto"]["reply"], out["auto"]["stream"]
        check(valid_calls(auto, list(params)) is True and finish == "tool_calls",
              "auto: the model's call is parsed into tool_calls (%s, %s)" % (auto, finish))
        check("<tool_call>" not in (auto["content"] or ""),
              "auto: no <tool_call> text left in content (%r)" % auto["content"])
        check(same_calls(s, auto) and s_finish == finish,
              "auto: the streamed deltas put together are the reply (%s vs %s)" % (s, auto))
        check(out["result_turn"] is not None and not out["result_turn"]["calls"] and
              out["result_turn"]["content"],
              "the tool's result carried back is answered in text (%s)" % out["result_turn"])
        for what, status, message in out["refused"]:
            check(status == 400, "%s is a 400 (%s: %s)" % (what, status, message))
        check("--enable_auto_tool_choice" in out["refused"][0][2],
              "the auto refusal names the flags (%s)" % out["refused"][0][2])
    finally:
        for s in servers:
            s.stop()
    return check.result()


if __name__ == "__main__":
    sys.exit(main())
