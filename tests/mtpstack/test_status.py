"""`mtpstack status` against a real process whose command line is a worker's and a real HTTP
server answering `/health` and `/identity` for it."""

from __future__ import annotations

import json
import os
import threading
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mtpstack.status import collect, render
from mtpstack.worker.proof import read_cmdline
from tests.sleeping_process import sleeping_process


def worker_argv(kind: str | None) -> list[str]:
    argv = ["mtpstack", "worker", "--model", "/m/target", "--draft-model", "/m/drafter", "--draft-depth", "3"]
    return argv + (["--draft-kind", kind] if kind else []) + ["--max-num-seqs", "1"]


@pytest.fixture
def run(tmp_path):
    """Start a fake worker: (argv kind, /identity drafter kind) -> the status of its run directory."""
    stack = ExitStack()

    def start(argv_kind: str | None, identity_kind: str | None) -> dict:
        proc = stack.enter_context(sleeping_process(worker_argv(argv_kind)))
        drafter = {"path": "/m/drafter"} | ({"kind": identity_kind} if identity_kind else {})
        # As a worker's /identity: its own pid and command line, what it loaded.
        identity = {"pid": proc.pid, "argv": read_cmdline(proc.pid), "target": {"path": "/m/target"}, "drafter": drafter,
                    "draft_depth": 3}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps(identity if self.path == "/identity" else {"status": "ok"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        state = {"pid": os.getpid(), "phase": "serving", "proxy": {"pid": None, "url": "http://127.0.0.1:1"},
                 "workers": {"w": {"pid": proc.pid, "url": url, "model": "m"}}}
        (tmp_path / "state.json").write_text(json.dumps(state))
        return collect(tmp_path)

    with stack:
        yield start


@pytest.mark.parametrize(
    ("argv_kind", "identity_kind", "shown"),
    [
        ("auto", "mtp", "mtp"),  # the worker resolved auto
        ("model", None, "model"),  # an /identity without the kind: the command line's
        (None, None, "-"),  # an older worker: neither says
    ],
)
def test_status_shows_the_drafter_kind_the_worker_resolved_else_the_one_it_was_asked_for(run, argv_kind, identity_kind, shown):
    status = run(argv_kind, identity_kind)
    weights = status["workers"]["w"]["weights"]
    assert weights["proved"], weights["why"]
    assert weights["kind"] == (None if shown == "-" else shown)
    line = next(line for line in render(status) if line.startswith("    weights"))
    assert line.endswith(f"drafter `/m/drafter` kind {shown} depth 3")


def test_a_kind_that_differs_from_the_declared_one_is_not_proved(run):
    weights = run("mtp", "model")["workers"]["w"]["weights"]
    assert not weights["proved"]
    assert "drafter kind: argv `mtp`, /identity `model`" in weights["why"]


def test_without_a_proxy_the_fleet_document_is_absent_and_says_why(run):
    status = run("auto", "mtp")
    assert status["fleet"] is None and status["fleet_error"] == "the proxy does not answer"
    assert render(status)[-1] == "fleet status: the proxy does not answer"


def test_the_fleet_documents_problems_are_printed(run):
    status = run("auto", "mtp") | {"fleet": {"problems": ["worker `w`: the proxy's gate is 2 but the worker serves 1 at once"]}}
    assert render(status)[-1] == "problem: worker `w`: the proxy's gate is 2 but the worker serves 1 at once"
