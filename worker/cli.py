"""`mtpstack worker` (serve a target with its drafter) and `mtpstack weights` (prove what a worker loaded).

mlx is imported only when a worker actually starts, so `mtpstack weights` stays light.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from mtpstack.errors import UserError, print_error
from mtpstack.logs import configure as configure_logs
from mtpstack.validator import (
    DEPTH_MAX,
    DEPTH_AUTO,
    DEPTH_MIN,
    SETTINGS,
    WORKER_SETTINGS,
    Mismatch,
    Setting,
    WeightsClaim,
    parse_depth_map,
)
from mtpstack.worker.classify import CLASS_PATTERN
from mtpstack.worker.proof import (
    ModelNotFound,
    WeightsProof,
    prove_weights,
    resolve_model_path,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    w = subparsers.add_parser(
        "worker",
        help="serve a target model with its MTP drafter (OpenAI API)",
        description="Serve a target model with its MTP drafter on the OpenAI API, at most --max-num-seqs sequences at once.",
    )
    for setting in WORKER_SETTINGS:
        w.add_argument(setting.flag, **_argument(setting))
    w.set_defaults(func=run_worker)

    p = subparsers.add_parser(
        "weights",
        help="prove which weights a running worker loaded",
        description="Print the weights a running worker loaded, read from its own command line and "
        "cross-checked against its /identity and the files on disk.",
    )
    p.add_argument("worker", metavar="PID|URL", help="the worker's process id, or its base URL")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for /identity (default: 5)")
    p.set_defaults(func=run_weights)


# -- mtpstack worker ---------------------------------------------------------------------


def _argument(setting: Setting) -> dict:
    """argparse's keywords for one row of the settings table."""
    kwargs = {"default": setting.default, "help": setting.help_text}
    if setting.type is not str:
        kwargs["type"] = setting.type
    if setting.choices is not None:
        kwargs["choices"] = setting.choices
    if setting.required:
        kwargs["required"] = True
    return kwargs


def _transformers_logs_as_json() -> None:
    """transformers logs through a handler of its own, as text: a client's prompt past the tokenizer's
    `model_max_length` printed "[transformers] Token indices sequence length is longer ..." into the
    worker's JSON log. Its records go to the root logger instead, one JSON object each."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # a backend without it never logs through it
        return
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()


def run_worker(args: argparse.Namespace) -> int:
    configure_logs(args.log_level)
    # transformers (which mlx-lm imports for some model families, Qwen3.5 among them) prints an
    # advisory that PyTorch is absent, as text through its own handler: a worker never uses PyTorch,
    # and its log is JSON lines.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    _transformers_logs_as_json()
    for setting in WORKER_SETTINGS:
        problem = setting.out_of_range(getattr(args, setting.name))
        if problem is not None:
            return print_error(problem, setting.hint)
    depth_map_flag = SETTINGS["draft_depth_map"].flag
    try:
        depth_map = parse_depth_map(args.draft_depth_map)
    except ValueError as e:
        return print_error(f"`{depth_map_flag}` is {e}", "write it as `code=4,prose=2`")
    for cls, depth in depth_map.items():
        if not CLASS_PATTERN.fullmatch(cls) or not (depth == DEPTH_AUTO or DEPTH_MIN <= depth <= DEPTH_MAX):
            return print_error(f"`{depth_map_flag}`: `{cls}={depth}` needs a class of letters, digits, `_`, `.`, `-` "
                               f"and a depth from {DEPTH_MIN} to {DEPTH_MAX} or `auto`")
    if DEPTH_AUTO in (args.draft_depth, *depth_map.values()) and not args.draft_model:
        return print_error(f"`{SETTINGS['draft_depth'].flag} auto` chooses how deep a drafter drafts, and no drafter is loaded",
                           f"pass `{SETTINGS['draft_model'].flag} PATH`, or a depth of 0 to decode without drafting")
    from mtpstack.worker.config import WorkerConfig
    from mtpstack.worker.server import serve

    # Fail before listening when a path is plainly wrong; loading itself happens behind /health.
    for setting in (SETTINGS["model"], SETTINGS["draft_model"]):
        if value := getattr(args, setting.name):
            try:
                resolve_model_path(value)
            except ModelNotFound as e:
                return print_error(str(e), f"pass a model directory or a hub id already in the cache to `{setting.flag}`")
    config = WorkerConfig(**{
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(WorkerConfig)},
        "draft_depth_map": depth_map,
        "served_model_name": args.served_model_name or Path(args.model.rstrip("/")).name,
    })
    try:
        if config.distributed_backend is not None:
            from mtpstack.worker.distributed import RankSetting, follow

            # Refused before listening when the environment names no rank or no peers.
            setting = RankSetting.from_environ(config.distributed_backend, config.distributed_strategy)
            code = follow(config) if setting.rank != 0 else asyncio.run(serve(config))
        else:
            code = asyncio.run(serve(config))
    except UserError as e:  # printed here: the exit below skips `mtpstack.cli.main`
        code = print_error(e)
    # Shut down cleanly by now (answers finished, sockets closed). mlx used from a thread other than
    # the main one (the generation thread) can abort the process in its static destructors at exit
    # (ml-explore/mlx#3126: "terminate called without an active exception", SIGABRT on about a third
    # of SIGTERMs here), so the worker leaves without running them, its log flushed first.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# -- mtpstack weights --------------------------------------------------------------------


def prove(target: str, timeout: float = 5.0) -> dict:
    """Gather and cross-check what a worker loaded (`prove_weights`, files re-hashed). Returns a
    report dict; `problems` lists disagreements. Raises `ProofError` when nothing can be compared."""
    if target.isdigit():
        proof = prove_weights(int(target), rehash=True, timeout=timeout)
    else:
        url = (target if "://" in target else f"http://{target}").rstrip("/")
        proof = prove_weights(url=url, rehash=True, timeout=timeout)
    return {"pid": proof.pid, "url": proof.url, "argv": proof.argv, "claim": proof.claim, "identity": proof.identity,
            "problems": [_sentence(m, proof) for m in proof.mismatches], "note": proof.note}


def _sentence(m: Mismatch, proof: WeightsProof) -> str:
    """One disagreement as `mtpstack weights` words it."""
    role = m.what.split()[0]
    if m.what == "pid":
        return f"/identity reports pid {m.got}, the process is {m.want}"
    if m.what == "argv":
        return "/identity reports a different command line than the process has"
    if m.what in ("target", "drafter"):
        if m.want is None or m.got is None:
            return f"the {m.what} is {m.want or 'none'} on the command line but {m.got or 'none'} on /identity"
        return f"the {m.what} path is `{m.want}` on the command line but `{m.got}` on /identity"
    if m.what.endswith(" resolved"):
        return f"the {role} resolves to `{m.want}` here but the worker loaded `{m.got}`"
    if m.what.endswith(" files"):
        return f"the {role}'s files cannot be read now: {m.got}"
    if m.what.endswith(" sha256"):
        return f"the {role}'s files changed since the worker loaded them: `{(proof.identity or {})[role].get('resolved_path')}`"
    if m.what == "depth":
        return f"the draft depth is {m.want} on the command line but {m.got} on /identity"
    if m.what == "depth per class":
        return f"the depth per class is {m.want} on the command line but {(proof.identity or {}).get('draft_depth_map')} on /identity"
    if m.what == "maxNumSeqs":
        return f"max_num_seqs is {m.want} on the command line but {m.got} on /identity"
    return f"the {m.what} is `{m.want}` on the command line but `{m.got}` on /identity"


def _render_text(report: dict) -> list[str]:
    claim: WeightsClaim = report["claim"]
    ident = report["identity"]
    lines = [f"worker   pid {report['pid']}  {report['url']}  backend {claim.backend}"]
    for role in ("target", "drafter"):
        path = getattr(claim, role)
        if path is None:
            lines.append(f"{role:<8} none")
            continue
        lines.append(f"{role:<8} {path}")
        if ident and ident.get(role):
            i = ident[role]
            q = i.get("quantization")
            quant = f"{q.get('bits')}-bit" if isinstance(q, dict) and q.get("bits") else "unquantized"
            lines.append(f"         resolved {i.get('resolved_path')}")
            lines.append(f"         bits {i.get('bits') or '-'} (config: {quant})  sha256 {i.get('sha256')}")
    by_class = "".join(f" {c}={d}" for c, d in claim.depth_map.items())
    lines.append(f"depth    {claim.depth if claim.depth is not None else '-'}{by_class}  max_num_seqs {claim.max_num_seqs}")
    if ident:
        lines.append(f"device   {ident.get('device')}  blas {ident.get('blas')}")
        v = ident.get("versions") or {}
        lines.append(f"versions mlx {v.get('mlx')}  mlx_lm {v.get('mlx_lm')}  mtpstack {v.get('mtpstack')}")
        if not report["problems"]:
            lines.append("proof    command line and /identity agree; weight files unchanged since load")
    if report["note"]:
        lines.append(f"proof    {report['note']}")
    return lines


def run_weights(args: argparse.Namespace) -> int:
    report = prove(args.worker, timeout=args.timeout)  # a `ProofError` is printed by `mtpstack.cli.main`
    if args.format == "json":
        claim: WeightsClaim = report["claim"]
        out = {k: v for k, v in report.items() if k != "claim"}
        out["claim"] = claim.__dict__
        print(json.dumps(out, indent=2))
    else:
        print("\n".join(_render_text(report)))
    if report["problems"]:
        for problem in report["problems"]:
            print(f"error: {problem}", file=sys.stderr)
        print("\nhint: restart the worker so that what it serves is what its command line says", file=sys.stderr)
        return 1
    return 0
