"""`mtpstack status`: what a `mtpstack up` run is doing, read from its run directory and its processes.

For each process: pid and whether it is alive, health, requests in flight (as the proxy
counts them) and, for workers, the weights read off the process's own command line and
checked against its `/identity` (without re-hashing the files: `mtpstack weights PID` does that),
with the drafter's kind (`mtp` or `model`) as the worker resolved it.

A part placed on another host (see `mtpstack up`) has no pid here: it is probed over HTTP at
the address its host is reached at, and its weights are as its `/identity` reports them
(proved only by `mtpstack status` on that host, which can read the process's command line).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mtpstack.errors import UserError
from mtpstack.runtime import http_status
from mtpstack.validator import Mismatch
from mtpstack.worker.proof import IdentityUnavailable, ProofError, WeightsProof, prove_weights


class StatusError(UserError):
    """No run to show: `mtpstack status` exits 1."""


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def local_weights(pid: int, url: str) -> dict:
    """The weights proof (`prove_weights`, without re-hashing) as `mtpstack status` shows it."""
    try:
        proof = prove_weights(pid, url, timeout=IDENTITY_TIMEOUT)
    except ProofError as e:
        so_far = e.proof if isinstance(e, IdentityUnavailable) else None
        if so_far is None:
            return {"proved": False, "why": "process gone or not a worker"}
        return _shown(so_far) | {"proved": False, "why": f"/identity answered {e.status or 'nothing'}"}
    out = _shown(proof)
    if proof.claim.backend == "mlx-lm":
        return out | {"proved": proof.proved, "why": "from the command line alone (mlx_lm.server has no /identity)"}
    if not proof.proved:
        return out | {"proved": False, "why": "; ".join(_clause(m) for m in proof.mismatches)}
    return out | {"proved": True, "why": "argv agrees with /identity", "device": proof.identity.get("device")}


#: How long `status` waits for a worker's `/identity`; it asks every worker in turn.
IDENTITY_TIMEOUT = 2.0


def _shown(proof: WeightsProof) -> dict:
    """What the command line names, with the drafter's kind as the worker resolved it, else as asked."""
    claim = proof.claim
    return {"target": claim.target, "drafter": claim.drafter, "depth": claim.depth, "depthMap": claim.depth_map or None,
            "maxNumSeqs": claim.max_num_seqs, "kind": proof.resolved_kind}


def _clause(m: Mismatch) -> str:
    """One disagreement as `status` words it: `what: argv `X`, /identity `Y``."""
    if m.what == "pid":
        return f"pid: /identity reports {m.got}"
    if m.what == "argv":
        return "argv: /identity reports another command line"
    return f"{m.what}: argv `{m.want}`, /identity `{m.got}`"


def _remote_weights(part: dict) -> dict:
    status, identity = http_status(part["url"] + "/identity")
    where = f"on host `{part['host']}`"
    if status != 200:
        return {"proved": False, "why": f"{where}: /identity answered {status or 'nothing'}"}
    drafter = identity.get("drafter") or {}
    return {
        "proved": False,
        "why": f"{where}, as its /identity reports (proved by `mtpstack status` there)",
        "target": (identity.get("target") or {}).get("path"),
        "drafter": drafter.get("path"),
        "kind": drafter.get("kind"),
        "depth": identity.get("draft_depth"),
        "depthMap": identity.get("draft_depth_map") or None,
        "device": identity.get("device"),
    }


#: The API key `mtpstack status` presents to the proxy when its keys file is set.
API_KEY_ENV = "MTPSTACK_API_KEY"


def _fleet(proxy_url: str) -> tuple[dict | None, str | None]:
    key = os.environ.get(API_KEY_ENV)
    code, body = http_status(proxy_url + "/v1/fleet/status", headers={"Authorization": f"Bearer {key}"} if key else None)
    if code == 200:
        return body, None
    if code == 401:
        return None, f"the proxy wants an API key: set `{API_KEY_ENV}`"
    return None, f"/v1/fleet/status answered {code or 'nothing'}"


def collect(run_dir: Path) -> dict:
    state_file = run_dir / "state.json"
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        raise StatusError(f"no run found: `{state_file}` does not exist", "start one with `mtpstack up`, or pass `--run-dir`") from None
    except ValueError:
        raise StatusError(f"`{state_file}` is not valid JSON") from None
    up_alive = _alive(state.get("pid"))
    proxy = state["proxy"]
    proxy_remote = bool(proxy.get("remote"))
    proxy_alive = proxy_remote or _alive(proxy.get("pid"))
    proxy_status, ready = http_status(proxy["url"] + "/readyz") if proxy_alive else (0, {})
    upstreams = ready.get("workers", {}) if isinstance(ready.get("workers"), dict) else {}
    fleet, fleet_error = _fleet(proxy["url"]) if proxy_status else (None, "the proxy does not answer")
    result = {
        "run_dir": str(run_dir),
        "phase": state.get("phase") if up_alive else "not running",
        "up_pid": state.get("pid"),
        "host": state.get("host"),
        "proxy": {
            "pid": proxy.get("pid"),
            "host": proxy.get("host") if proxy_remote else None,
            "alive": proxy_status != 0 if proxy_remote else proxy_alive,
            "url": proxy["url"],
            "ready": proxy_status == 200,
            "restarts": proxy.get("restarts", 0),
            "log": proxy.get("log"),
        },
        "workers": {},
        # The proxy's `GET /v1/fleet/status`, the same document (docs/fleet-status.md).
        "fleet": fleet,
        "fleet_error": fleet_error,
    }
    for name, w in state.get("workers", {}).items():
        remote = bool(w.get("remote"))
        alive = remote or _alive(w.get("pid"))
        health = http_status(w["url"] + "/health")[0] if alive else 0
        if remote:
            weights = _remote_weights(w) if health else {"proved": False, "why": f"on host `{w['host']}`: no answer"}
        else:
            weights = local_weights(w["pid"], w["url"]) if alive else {"proved": False, "why": "not running"}
        seen = upstreams.get(name, {})
        result["workers"][name] = {
            "pid": w.get("pid"),
            "host": w.get("host") if remote else None,
            "alive": health != 0 if remote else alive,
            "model": w.get("model"),
            "url": w["url"],
            "health": health,
            "inflight": seen.get("inflight"),
            "gate": seen.get("gate"),
            "restarts": w.get("restarts", 0),
            "weights": weights,
            "log": w.get("log"),
        }
    return result


def _where(part: dict) -> str:
    """`pid 1234` for a process of this run, `on host `mac1`` for a part placed elsewhere."""
    return f"on host `{part['host']}`" if part.get("host") else f"pid {part['pid'] or '-':>7}"


def render(status: dict) -> list[str]:
    """Pure: the status as text lines."""
    p = status["proxy"]
    here = f", host `{status['host']}`" if status.get("host") else ""
    lines = [
        f"run: {status['run_dir']} ({status['phase']}{here})",
        f"proxy    {_where(p)}  {'up' if p['alive'] else 'down':4}  {'ready' if p['ready'] else 'not ready':9}  {p['url']}"
        + (f"  restarts {p['restarts']}" if p["restarts"] else ""),
    ]
    for name, w in status["workers"].items():
        health = {200: "healthy", 0: "no answer"}.get(w["health"], f"health {w['health']}")
        inflight = "-" if w["inflight"] is None else f"{w['inflight']}/{w['gate']}"
        lines.append(
            f"worker `{name}`  {_where(w)}  {'up' if w['alive'] else 'down':4}  {health:9}  "
            f"in flight {inflight}  {w['url']}" + (f"  restarts {w['restarts']}" if w["restarts"] else "")
        )
        weights = w["weights"]
        if weights.get("target"):
            drafter = (
                f", drafter `{weights['drafter']}` kind {weights.get('kind') or '-'} depth {weights['depth']}"
                + "".join(f" {c}={d}" for c, d in (weights.get("depthMap") or {}).items())
                if weights.get("drafter")
                else ", no drafter"
            )
            mark = "proved" if weights["proved"] else "NOT proved"
            lines.append(f"    weights {mark} ({weights['why']}): target `{weights['target']}`{drafter}")
        else:
            lines.append(f"    weights not proved: {weights['why']}")
    fleet = status.get("fleet")
    if fleet is not None:
        lines += [f"problem: {p}" for p in fleet.get("problems", [])]
    elif status.get("fleet_error"):
        lines.append(f"fleet status: {status['fleet_error']}")
    return lines
