"""The client matrix: each agent client library's typical use (`devkit/clients.py`), run in its own
virtualenv against a real stack, every cell green:

- on the demo as `mtpstack up` ships it (its Qwen3.5-style template: tool calls, reasoning);
- on a model whose chat template has no tool-call format (the generic format serves its calls).

docs/agent-api.md's table is the same run beside mlx_lm.server (`python -m devkit.client_matrix`).
"""

from __future__ import annotations

from devkit.client_matrix import run_clients
from mtpstack.runtime import free_port
from mtpstack.up import DEMO_MODEL, default_fleet
from tests.e2e.conftest import running_stack


def failures(report: dict) -> list[str]:
    return [f"{c['client']} / {c['feature']}: {c['detail']}" for c in report["cells"] if not c["ok"]]


def test_every_client_works_against_the_demo_as_shipped(clients_python, tmp_path):
    config = default_fleet()
    config["proxy"]["port"] = free_port()
    config["workers"]["demo"]["port"] = free_port()
    with running_stack(tmp_path, config) as stack:
        report = run_clients(clients_python, stack.proxy_url, DEMO_MODEL)
    assert len(report["cells"]) >= 20 and not failures(report), "\n".join(failures(report))


def test_every_client_works_on_a_template_without_a_tool_format(clients_python, stack):
    report = run_clients(clients_python, stack.proxy_url, "tiny")
    assert len(report["cells"]) >= 20 and not failures(report), "\n".join(failures(report))
