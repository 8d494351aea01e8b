"""Shared by the Python integration tests of the OpenAI-compatible API: a venv with the PyPI
packages a test needs (exit 77, ctest's SKIP, when it cannot be made), and `duet serve` as a
child in its own process group, killed on exit even on failure.

    py = ensure_venv(work, ["openai", "jsonschema"], log)
    server = Server(duet, ["--colocated", "--model=" + model, "--http_port=0"])
    ...  server.http, server.port, server.request("GET", "/health")
    server.stop()

A test whose client half runs in the venv (the openai package) re-runs its own script there:

    out = run_client(py, __file__, [s.http for s in servers], work)  # its client_main's JSON
    checks = Checks(log); checks(cond, "what"); return checks.result()
"""
import http.client
import json
import os
import signal
import subprocess
import sys
import time

SKIP = 77


def ensure_venv(work, packages, log):
    """A venv under `work` with `packages` installed (once; a marker names them)."""
    venv = os.path.join(work, "venv")
    py = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, ".duet-ok-" + "-".join(sorted(packages)))
    if os.path.exists(marker):
        return py
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q"] + list(packages), check=True,
                       timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        log("SKIP: cannot create the venv or install %s:" % ", ".join(packages), e)
        sys.exit(SKIP)
    open(marker, "w").close()
    return py


def venv_site_packages(work):
    """The venv's site-packages, for this (system) interpreter to import from too."""
    lib = os.path.join(work, "venv", "lib")
    return next(os.path.join(lib, d, "site-packages") for d in os.listdir(lib))


class Server:
    """`duet serve ARGS` in its own process group; killed on exit even on failure. Reads its
    `http`, `metrics` and `ready` lines."""

    def __init__(self, duet, args, ready_timeout=120):
        self.proc = subprocess.Popen([duet, "serve"] + list(args), stdout=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.http = None
        self.metrics = {}
        self.grpc = None
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            line = line.strip()
            if line.startswith("http "):
                self.http = line.split()[1]
            elif line.startswith("metrics "):
                _, node, url = line.split()
                self.metrics[node] = url
            elif line.startswith("ready "):
                self.grpc = line.split()[1]
                break
        if not self.grpc or not self.http:
            self.stop()
            raise RuntimeError("the server did not start (http=%s)" % self.http)
        hostport = self.http[len("http://"):]
        self.host, port = hostport.split(":")
        self.port = int(port)

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()

    def request(self, method, path, body=None, headers=None, raw=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        resp = conn.getresponse()
        payload = resp.read().decode("utf-8", "replace")
        conn.close()
        return resp.status, dict(resp.getheaders()), payload


def run_client(py, script, urls, work, timeout=900):
    """Runs `script --client URL... --out FILE` with the venv's python; returns FILE's JSON."""
    out_path = os.path.join(work, "client.json")
    subprocess.run([py, os.path.abspath(script), "--client"] + list(urls) + ["--out", out_path],
                   check=True, timeout=timeout)
    with open(out_path) as f:
        return json.load(f)


class Checks:
    """Logs each check ("ok:" / "FAIL:") and counts the failures; result() is the exit code."""

    def __init__(self, log):
        self.log = log
        self.failures = []

    def __call__(self, cond, what):
        self.log("ok:" if cond else "FAIL:", what)
        if not cond:
            self.failures.append(what)

    def result(self):
        if self.failures:
            self.log("%d checks failed" % len(self.failures))
            return 1
        self.log("all checks passed")
        return 0
