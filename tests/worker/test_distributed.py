"""A worker across two ranks of MLX's ring backend on loopback (two real processes, the tiny hybrid
pair with its MTP head): greedy output as one process's, batched; `/identity` listing every rank;
a rank killed or hung noticed in bounded time, idle or busy, with no request left hanging."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

import mlx.core as mx

from mtpstack.errors import UserError
from mtpstack.runtime import Process, free_port, free_port_run, url_of
from mtpstack.validator import FleetConfig, rank_peers, worker_argv
from mtpstack.worker.distributed import MIN_MLX, check_mlx
from mtpstack.worker.launcher import rank_environments, resolve_command, worker_env

#: Ranks run only on an mlx the worker accepts; on an older one it refuses to start (tested below).
ranks_run = pytest.mark.skipif(tuple(map(int, mx.__version__.split(".")[:2])) < MIN_MLX,
                               reason=f"mlx {mx.__version__}: the distributed worker needs mlx {'.'.join(map(str, MIN_MLX))} or newer")

HTTP_TIMEOUT = 30.0
START_TIMEOUT = 60.0

PROMPTS = ["def main():", "The quick brown fox jumps over", "import os\nimport sys\n", "x"]
MAX_TOKENS = 16
#: The issue's bound: a lost rank turns `/health` non-200 within this, idle or busy.
LOST_WITHIN = 10.0


class RankedWorker:
    """`size` rank processes of one distributed worker on loopback, started as `mtpstack up` starts them:
    the argv of `validator.worker_argv`, the environment of `launcher.rank_environments`."""

    def __init__(self, tmp, target, drafter, *, strategy: str, width: int = 4, depth: int = 4, size: int = 2,
                 max_context_tokens: int | None = None):
        self.port = free_port()
        hosts = {f"h{r}": {"address": "127.0.0.1"} for r in range(size)}
        fleet = FleetConfig.model_validate({
            "proxy": {"deployOn": "h0", "concurrencyLimit": width},
            "hosts": hosts,
            "workers": {"big": {
                "model": "tiny", "target": {"path": str(target), "bits": "fp32"},
                "drafter": {"path": str(drafter), "bits": "fp32", "depth": depth, "kind": "mtp"},
                "maxNumSeqs": width, "port": self.port, "prefixCache": {"maxGiB": 0}, "maxContextTokens": max_context_tokens,
                "distributed": {"hosts": list(hosts), "strategy": strategy, "basePort": free_port_run(len(hosts))},
            }},
        })
        argv = resolve_command(worker_argv(fleet.workers["big"]))
        envs = rank_environments(rank_peers(fleet, "big"), "ring", tmp / f"hostfile-{self.port}.json")
        self.ranks = [
            Process(argv, log_path=tmp / f"rank{r}-{self.port}.log", name=f"rank{r}", kind="worker",
                    url=url_of("127.0.0.1", self.port), env=worker_env({**os.environ, **env}))
            for r, env in enumerate(envs)
        ]
        self.url = self.ranks[0].url

    def __enter__(self) -> "RankedWorker":
        for p in reversed(self.ranks):
            p.start()
        try:
            self.ranks[0].wait_ready("/health", START_TIMEOUT, state="healthy")
        except Exception:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for p in self.ranks:
            try:
                p.signal(signal.SIGCONT)
            except Exception:
                pass
            p.stop(timeout=5)

    def health(self) -> int | None:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None  # the process is gone: as non-200 to a proxy as a 503


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def greedy(url: str, depth: int, width: int) -> dict[str, str]:
    """Each prompt's greedy completion, `width` requests at once."""
    body = lambda p: {"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0, "num_draft_tokens": depth, "ignore_eos": True}
    with ThreadPoolExecutor(width) as pool:
        answers = list(pool.map(lambda p: post(url, body(p)), PROMPTS))
    assert all(status == 200 for status, _ in answers), answers
    return {p: a["choices"][0]["text"] for p, (_, a) in zip(PROMPTS, answers)}


@pytest.fixture(scope="module")
def single(hybrid_pair, tmp_path_factory, live_worker_class):
    target, head = hybrid_pair
    with live_worker_class(tmp_path_factory.mktemp("single"), target, head, depth=4, width=4, extra=["--draft-kind", "mtp"]) as w:
        yield w


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
@ranks_run
def test_greedy_output_is_lossless_at_every_depth_and_width(hybrid_pair, tmp_path, single, strategy):
    """Pipeline: each rank runs whole layers, so the output is one process's, token for token.
    Tensor: each layer's sums are split across ranks and added in another order, so the sharded
    target may break a near-tie differently from one process; its speculative and batched output
    must still be its own plain output (depth 0, one row)."""
    target, head = hybrid_pair
    with RankedWorker(tmp_path, target, head, strategy=strategy) as ranked:
        reference = greedy(single.url, 0, 1) if strategy == "pipeline" else greedy(ranked.url, 0, 1)
        for depth in range(0, 5):
            for width in (1, 4):
                assert greedy(ranked.url, depth, width) == reference, (strategy, depth, width)


@ranks_run
def test_identity_lists_every_rank_with_its_pid_host_and_weights(hybrid_pair, tmp_path, single):
    target, head = hybrid_pair
    with RankedWorker(tmp_path, target, head, strategy="tensor") as ranked:
        with urllib.request.urlopen(ranked.url + "/identity", timeout=HTTP_TIMEOUT) as r:
            identity = json.loads(r.read())
        one = single.get_json("/identity")
    assert identity["pid"] == ranked.ranks[0].pid
    assert [r["rank"] for r in identity["ranks"]] == [0, 1]
    assert [r["pid"] for r in identity["ranks"]] == [p.pid for p in ranked.ranks]
    weights = {"target": one["target"]["sha256"], "drafter": one["drafter"]["sha256"]}
    assert all(r["weights"] == weights and r["host"] for r in identity["ranks"])
    assert identity["distributed"] == {"backend": "ring", "strategy": "tensor", "size": 2}
    assert identity["prefix_cache"]["max_bytes"] == 0


@ranks_run
def test_a_distributed_worker_refuses_a_prompt_past_its_context_cap(hybrid_pair, tmp_path):
    """`--max-context-tokens` caps every rank's engine as it caps one process's (`build_engine`)."""
    target, head = hybrid_pair
    cap = 64
    with RankedWorker(tmp_path, target, head, strategy="pipeline", width=1, max_context_tokens=cap) as ranked:
        with urllib.request.urlopen(ranked.url + "/identity", timeout=HTTP_TIMEOUT) as r:
            identity = json.loads(r.read())
        assert (identity["context_length"], identity["max_context_tokens"]) == (cap, cap)
        status, body = post(ranked.url, {"prompt": [1] * cap, "max_tokens": 1})
        assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
        assert f"{cap} tokens" in body["error"]["message"]
        status, body = post(ranked.url, {"prompt": [1] * (cap - 8), "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] <= cap


def _wait_unhealthy(ranked: RankedWorker, within: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < within:
        if ranked.health() != 200:
            return time.monotonic() - start
        time.sleep(0.2)
    raise AssertionError(f"/health still answered 200 {within} s after the rank was lost")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
@ranks_run
def test_an_idle_worker_notices_a_lost_rank_and_exits_as_one(hybrid_pair, tmp_path, how):
    target, head = hybrid_pair
    with RankedWorker(tmp_path, target, head, strategy="tensor") as ranked:
        ranked.ranks[1].signal(how)
        took = _wait_unhealthy(ranked, LOST_WITHIN)
        # The whole worker exits (non-zero), so its service manager restarts it as one.
        assert ranked.ranks[0].wait(timeout=LOST_WITHIN) != 0, ranked.ranks[0].log_text()
        assert "lost a rank" in ranked.ranks[0].log_text()
    # Lower bound: not before the rank went; upper: the heartbeat plus the peer timeout, well under 10 s.
    assert 0 <= took < LOST_WITHIN


@ranks_run
def test_a_request_in_flight_when_a_rank_dies_gets_an_error_not_a_hang(hybrid_pair, tmp_path):
    target, head = hybrid_pair
    with RankedWorker(tmp_path, target, head, strategy="pipeline", width=2) as ranked:
        with ThreadPoolExecutor(1) as pool:
            # Long enough to be in flight when the rank goes (500 tokens take the tiny pair a few seconds on two ranks).
            future = pool.submit(post, ranked.url, {"prompt": "x", "max_tokens": 500, "ignore_eos": True, "temperature": 0})
            time.sleep(1.0)
            ranked.ranks[1].signal(signal.SIGKILL)
            start = time.monotonic()
            try:
                status, body = future.result(timeout=LOST_WITHIN)
                assert status >= 500 and body["error"], body
            except (urllib.error.URLError, ConnectionError):
                pass  # the connection closed with the process: an error too, not a hang
            assert time.monotonic() - start < LOST_WITHIN
        assert ranked.ranks[0].wait(timeout=LOST_WITHIN) != 0


def test_an_mlx_too_old_for_the_ranks_is_refused_before_they_start():
    with pytest.raises(UserError) as e:
        check_mlx("0.31.2")  # the Nix package's pin on Linux: its ranks hang in the first step
    assert "needs mlx 0.32 or newer, found 0.31.2" in e.value.message and "mlx>=0.32" in e.value.hint
    check_mlx("0.32.4")
    check_mlx("1.0.0")
