"""Regenerate docs/agent-api.md's client matrix: every cell of `devkit/clients.py` against the shipped
demo, served by the mtpstack worker and by mlx_lm.server side by side.

    .venv/bin/python -m devkit.client_matrix            # print the table
    .venv/bin/python -m devkit.client_matrix --write    # and write it into docs/agent-api.md

Needs the clients' virtualenv (`scripts/bootstrap-clients`); the TypeScript Anthropic SDK's cells run
where node and `.clients-node/` are there (`scripts/bootstrap-npm`, run by `scripts/test`).
mlx_lm.server loads the demo target alone: it cannot load an MTP head. A third column, LiteLLM's
proxy in front of mlx_lm.server (the way a Mac user gets Anthropic's API from mlx-lm), runs where
a `litellm` command with its proxy is installed (`--litellm`, default `litellm` on PATH; e.g.
`python3 -m venv /tmp/ll && /tmp/ll/bin/pip install 'litellm[proxy]==1.80.0'`, which installs here,
unlike 1.110's proxy extra).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "agent-api.md"
BEGIN, END = "<!-- client-matrix:begin -->", "<!-- client-matrix:end -->"
SERVERS = ("mtpstack", "mlx_lm.server")
LITELLM = "LiteLLM -> mlx_lm.server"
CLIENTS = ROOT / "devkit" / "clients.py"
NODE_CLIENTS = ROOT / "devkit" / "clients_anthropic.cjs"
NODE_MODULES = Path(os.environ.get("MTPSTACK_NODE_CLIENTS", ROOT / ".clients-node")) / "node_modules"
#: Every cell is a few bounded calls; the whole matrix takes about a minute on a tiny model.
MATRIX_TIMEOUT = 1200


def node_clients() -> bool:
    """Whether the TypeScript clients can run here: node, and the SDK `scripts/bootstrap-npm` installs."""
    return shutil.which("node") is not None and (NODE_MODULES / "@anthropic-ai" / "sdk").is_dir()


def run_clients(python: Path, base_url: str, model: str) -> dict:
    """Every client's cells against `base_url` (without `/v1`): the Python clients in their virtualenv,
    then the TypeScript ones where they are installed, in one report."""
    out = subprocess.run([str(python), str(CLIENTS), "--base-url", base_url + "/v1", "--model", model],
                         capture_output=True, text=True, timeout=MATRIX_TIMEOUT, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"{CLIENTS.name} exited {out.returncode}: {out.stderr[-3000:]}")
    report = json.loads(out.stdout)
    if node_clients():
        node = subprocess.run(["node", str(NODE_CLIENTS), "--base-url", base_url, "--model", model],
                              capture_output=True, text=True, timeout=MATRIX_TIMEOUT, stdin=subprocess.DEVNULL,
                              env={**os.environ, "NODE_PATH": str(NODE_MODULES)})
        if node.returncode != 0:
            raise RuntimeError(f"{NODE_CLIENTS.name} exited {node.returncode}: {node.stderr[-3000:]}")
        extra = json.loads(node.stdout)
        report["versions"].update(extra["versions"])
        report["cells"] += extra["cells"]
    return report


def _litellm(litellm: str, port: int, logdir: Path, upstream: str, upstream_model: str):
    """LiteLLM's proxy on `port`, serving the demo's name from an OpenAI-compatible `upstream`."""
    from mtpstack.runtime import Process, url_of
    from mtpstack.up import DEMO_MODEL

    config = logdir / "litellm.yaml"
    config.write_text(json.dumps({"model_list": [{"model_name": DEMO_MODEL, "litellm_params": {
        "model": f"openai/{upstream_model}", "api_base": upstream + "/v1", "api_key": "unused"}}]}))
    proc = Process([litellm, "--config", str(config), "--port", str(port), "--num_workers", "1"], log_path=logdir / "litellm.log",
                   name="litellm", kind="peer", url=url_of("127.0.0.1", port), env={**os.environ, "LITELLM_LOG": "ERROR"})
    proc.start()
    proc.wait_ready("/health/liveliness", 300, state="ready")
    return proc, DEMO_MODEL


def _start(name: str, port: int, logdir: Path):
    from mtpstack.runtime import Process, url_of
    from mtpstack.up import DEMO_MODEL, default_fleet
    from mtpstack.validator import WorkerProfile, worker_argv
    from mtpstack.worker.demo import DEMO_TARGET
    from mtpstack.worker.launcher import resolve_command, worker_env

    env = worker_env()
    hf_cache = logdir / "hf-cache"  # mlx_lm.server answers /v1/models with an empty body without one
    hf_cache.mkdir(exist_ok=True)
    env.setdefault("HF_HUB_CACHE", str(hf_cache))
    if name == "mtpstack":
        spec = dict(default_fleet()["workers"]["demo"], port=port)
        argv, model = resolve_command(worker_argv(WorkerProfile.model_validate(spec))), DEMO_MODEL
    else:
        argv = [sys.executable, "-m", "mlx_lm.server", "--model", str(DEMO_TARGET), "--host", "127.0.0.1", "--port", str(port)]
        model = str(DEMO_TARGET)
    proc = Process(argv, log_path=logdir / f"{name}.log", name=name, kind="worker", url=url_of("127.0.0.1", port), env=env)
    proc.start()
    proc.wait_ready("/health", 300, state="healthy")
    return proc, model


def run(python: Path, litellm: str | None) -> dict:
    from mtpstack.runtime import free_port

    reports = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SERVERS:
            proc, model = _start(name, free_port(), Path(tmp))
            try:
                reports[name] = run_clients(python, proc.url, model)
                if name == "mlx_lm.server" and litellm is not None:
                    peer, peer_model = _litellm(litellm, free_port(), Path(tmp), proc.url, model)
                    try:
                        reports[LITELLM] = run_clients(python, peer.url, peer_model)
                    finally:
                        peer.stop()
            finally:
                proc.stop()
    return reports


def table(reports: dict) -> str:
    versions = reports[SERVERS[0]]["versions"]
    servers = [s for s in (*SERVERS, LITELLM) if s in reports]
    lines = ["| client | feature | " + " | ".join(servers) + " |", "|---|---|" + "---|" * len(servers)]
    cells = {s: {(c["client"], c["feature"]): c for c in reports[s]["cells"]} for s in servers}
    for key in cells[SERVERS[0]]:
        marks = []
        for s in servers:
            c = cells[s].get(key)
            detail = c["detail"].replace(f"{ROOT}/", "") if c else ""  # no checkout's path in the docs
            detail = " ".join(detail.split())  # one table row: an exception's text can span lines
            marks.append("yes" if c and c["ok"] else f"no: {detail[:70].replace('|', '/')}" if c else "-")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(marks) + " |")
    passed = {s: sum(c["ok"] for c in cells[s].values()) for s in servers}
    lines += ["", "Passed: " + ", ".join(f"{s} {passed[s]}/{len(cells[s])}" for s in servers) + ". Client versions: "
              + ", ".join(f"{k} {v}" for k, v in versions.items()) + f". Run {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC."]
    return "\n".join(lines)


def write(text: str) -> None:
    doc = DOC.read_text()
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", type=Path, default=ROOT / ".venv-clients" / "bin" / "python",
                   help="the clients' interpreter (default: .venv-clients, from scripts/bootstrap-clients)")
    p.add_argument("--write", action="store_true", help=f"write the table into {DOC.relative_to(ROOT)}")
    p.add_argument("--litellm", default=shutil.which("litellm"),
                   help="LiteLLM's command, for the peer column (default: `litellm` on PATH; none: no column)")
    args = p.parse_args(argv)
    if not args.python.exists():
        print(f"error: {args.python} is missing\n\nhint: run scripts/bootstrap-clients", file=sys.stderr)
        return 2
    text = table(run(args.python, args.litellm))
    print(text)
    if args.write:
        write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
