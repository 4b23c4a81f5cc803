"""A worker across hosts: the ranks of MLX's distributed runtime running one engine in lockstep.

Each rank is a process started with the environment `mlx.launch` would give it (`MLX_RANK`, and
`MLX_HOSTFILE` for the ring backend: a JSON list of `["ip:port"]` per rank), by its host's service
manager or by `mtpstack up`; it joins the group with `mx.distributed.init` and loads its part of the
target with mlx-lm's own `shard(group)` (tensor) or `pipeline(group)` (pipeline). The drafter is
replicated: every rank drafts from the same hidden state.

Rank 0 serves HTTP and decides; the others follow. Before every scheduler step rank 0 broadcasts
what the step is (the sequences that joined, with their prompts and sampling settings, and the
ones still alive), then every rank runs the same `Scheduler.step` with the same rows. Inside a
step the engine's `agree` hands every rank rank 0's drafted and sampled tokens, so rows advance
alike even where only rank 0 knows a request's constraint (its grammar). Every exchange is an
`all_sum` (the other ranks contribute zeros): nothing here reimplements a collective.

A lost peer is noticed in bounded time, idle or not: idle rank 0 meets the others every
`IDLE_MEETING_SECONDS`; a meeting that does not end within `PEER_TIMEOUT_SECONDS` (a step: the
worker's stall limit) means a peer hung, and a dead peer makes the collective fail at once. Rank 0
then answers 503, ends every request in flight with an error and exits after `EXIT_GRACE_SECONDS`;
a follower that loses rank 0 exits at once. The service manager (or `mtpstack up`) restarts the
worker as one.

The prefix cache is off on a distributed worker: each rank would hold its own snapshots, and the
ranks would have to agree on every hit and every eviction.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import socket
import sys
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from mtpstack.errors import UserError
from mtpstack.worker.config import WorkerConfig
from mtpstack.worker.generation import Event, GenerationLoop

log = logging.getLogger("mtpstack.worker")

#: Idle rank 0 meets its peers this often (an empty announcement), so a lost peer is noticed
#: without a request.
IDLE_MEETING_SECONDS = 0.1
#: After an idle announcement a follower naps this long before waiting for the next one: a rank
#: waiting inside a ring collective polls (about a fifth of a core here), so idle followers wait
#: there only for the tail of each interval. A request arriving meanwhile waits at most this long
#: for the followers to come back.
FOLLOWER_NAP_SECONDS = 0.095
#: A meeting outside a step that takes longer than this means a peer hung. With the idle meetings,
#: a hung or dead peer turns `/health` non-200 within about 5 s of going (the issue asks for 10).
PEER_TIMEOUT_SECONDS = 5.0
#: A follower waits this long for rank 0's next word while idle.
FOLLOWER_WAIT_SECONDS = IDLE_MEETING_SECONDS + PEER_TIMEOUT_SECONDS
#: Loading differs between ranks (each reads its own files); the first meeting after it may wait this long.
LOAD_MEETING_SECONDS = 600.0
#: After a loss, rank 0's answers get this long to carry their errors out before the process exits.
EXIT_GRACE_SECONDS = 1.0
#: Bytes of one rank's self-description in the identity exchange.
IDENTITY_BYTES = 4096

RANK_ENV = "MLX_RANK"
HOSTFILE_ENV = "MLX_HOSTFILE"
#: JACCL's device file (`jaccl/jaccl.cpp` reads `JACCL_IBV_DEVICES`, else this): one row of RDMA
#: devices per rank, so the group's size is its number of rows.
IBV_DEVICES_ENV = "MLX_IBV_DEVICES"


@dataclass(frozen=True)
class RankSetting:
    """What this process is in the group, from the environment `mlx.launch` would set."""

    rank: int
    size: int
    backend: str
    strategy: str

    @classmethod
    def from_environ(cls, backend: str, strategy: str, environ=os.environ) -> "RankSetting":
        hint = ("start each rank from its unit (Nix) or with `mtpstack up`, which set MLX_RANK and MLX_HOSTFILE "
                "(jaccl: MLX_IBV_DEVICES and MLX_JACCL_COORDINATOR) as `mlx.launch` would")
        try:
            rank = int(environ[RANK_ENV])
        except (KeyError, ValueError):
            raise UserError(f"a distributed worker needs `{RANK_ENV}` (its rank) in its environment", hint) from None
        # The file the backend takes its group from: the ring's hostfile (one `["ip:port"]` per
        # rank), JACCL's device file (one row of RDMA devices per rank).
        env, what = (HOSTFILE_ENV, "hostfile") if backend == "ring" else (IBV_DEVICES_ENV, "RDMA device file")
        path = environ.get(env) if backend == "ring" else environ.get("JACCL_IBV_DEVICES") or environ.get(env)
        try:
            with open(path or "") as f:
                rows = json.load(f)
        except (OSError, ValueError) as e:
            raise UserError(f"the {backend} backend needs `{env}` naming its {what}: `{path}`: {e}", hint) from None
        if not isinstance(rows, list) or len(rows) < 2:
            raise UserError(f"the {what} `{path}` lists fewer than two ranks", hint)
        size = len(rows)
        if not 0 <= rank < size:
            raise UserError(f"`{RANK_ENV}` is {rank}, outside the group of {size} ranks", hint)
        return cls(rank=rank, size=size, backend=backend, strategy=strategy)


#: The oldest mlx the ranks are known to run on. With mlx 0.31.2 (the Nix package's pin on Linux)
#: beside mlx-lm 0.32.2 the ranks start, then hang in their first step; 0.32.4 is tested.
MIN_MLX = (0, 32)


def check_mlx(version: str) -> None:
    """Refuses an mlx the distributed worker does not run on, before it could report healthy."""
    try:
        found = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return  # a development build: let it try
    if found < MIN_MLX:
        raise UserError(f"a worker across hosts needs mlx {'.'.join(map(str, MIN_MLX))} or newer, found {version}: "
                        "with it the ranks hang in their first step",
                        f"install mlx>={'.'.join(map(str, MIN_MLX))} on every host, or serve this model from one process")


def wheel_platform(wheel_file: str) -> str | None:
    """The platform tag (`macosx_14_0_arm64`) of a wheel's `WHEEL` file's first `Tag:` line."""
    for line in wheel_file.splitlines():
        if line.startswith("Tag:"):
            return line.split(":", 1)[1].strip().split("-")[-1]
    return None


def metal_wheel_tag() -> str | None:
    """The platform tag of the installed mlx-metal wheel; None when mlx-metal is not installed."""
    from importlib import metadata

    try:
        return wheel_platform(metadata.distribution("mlx-metal").read_text("WHEEL") or "")
    except metadata.PackageNotFoundError:
        return None


def jaccl_unavailable(system: str, metal_tag: str | None) -> tuple[str, str]:
    """Why `mx.distributed.is_available("jaccl")` said no, as (a clause for the error, a hint).
    MLX compiles JACCL into libmlx only for macOS with a deployment target of 26.2 or later
    (`mlx/distributed/jaccl/CMakeLists.txt`; otherwise `no_jaccl.cpp`, whose `is_available()` is
    always false), and its release builds each mlx-metal wheel for 14.0, 15.0 and 26.2: only the
    `macosx_26_0` wheel has it. With it, JACCL is available once the system's `librdma.dylib`
    (macOS 26.2) loads."""
    if system != "Darwin":
        return ": JACCL (RDMA over Thunderbolt) runs on macOS only", "use the `ring` backend on this host"
    version = re.match(r"macosx_(\d+)_", metal_tag or "")
    if version and int(version.group(1)) < 26:
        return (
            f": its mlx-metal is the `{metal_tag}` wheel, which MLX builds without JACCL (only its macOS 26 wheels carry it)",
            "on macOS 26.2 or later, install mlx-metal's `macosx_26_0_arm64` wheel (pip picks it there by itself; with "
            "Nix, `services.mtpstack` takes it on a host that runs a `jaccl` rank)",
        )
    return (
        ": JACCL is built in but found no RDMA support",
        "JACCL needs macOS 26.2 or later (it loads the system's librdma.dylib) with RDMA over Thunderbolt enabled: "
        "run `rdma_ctl enable` in macOS Recovery once per Mac, then check with `ibv_devices`",
    )


def join_group(setting: RankSetting):
    """`mx.distributed.init` on the configured backend; refuses a backend this machine lacks."""
    import mlx.core as mx

    # A backend this machine lacks is refused first: no mlx version would make it run here.
    if not mx.distributed.is_available(setting.backend):
        why, hint = jaccl_unavailable(platform.system(), metal_wheel_tag()) if setting.backend == "jaccl" else ("", None)
        raise UserError(f"mlx's `{setting.backend}` backend is not available on this machine{why}", hint)
    check_mlx(mx.__version__)
    group = mx.distributed.init(strict=True, backend=setting.backend)
    if group.size() != setting.size or group.rank() != setting.rank:
        raise UserError(f"the group has rank {group.rank()} of {group.size()}, the environment said {setting.rank} of {setting.size}")
    return group


class Channel:
    """Rank 0's word to every rank, over `all_sum`: rank 0 contributes the values, the others zeros."""

    def __init__(self, group):
        self.group = group
        self.rank = group.rank()

    def _sum(self, array):
        import mlx.core as mx

        out = mx.distributed.all_sum(array, group=self.group)
        mx.eval(out)
        return out

    def agree(self, array):
        """Rank 0's `array` (integer tokens) on every rank. The array is computed first: the
        collectives it depends on (a sharded LM head's gather) then run in the same order on
        every rank, before this one, whatever a rank contributes."""
        import mlx.core as mx

        mx.eval(array)
        mine = array.astype(mx.int32)
        if self.rank != 0:
            mine = mx.zeros_like(mine)
        return self._sum(mine).astype(array.dtype)

    def broadcast(self, message: dict | None) -> dict:
        """Rank 0's JSON `message` on every rank (the others pass None)."""
        import mlx.core as mx

        data = json.dumps(message, separators=(",", ":")).encode() if self.rank == 0 else b""
        [length] = self._sum(mx.array([len(data)], dtype=mx.int32)).tolist()
        payload = list(data) if self.rank == 0 else [0] * length
        return json.loads(bytes(self._sum(mx.array(payload, dtype=mx.int32)).tolist()))

    def gather(self, mine: dict) -> list[dict]:
        """Every rank's `mine`, in rank order, on every rank."""
        import mlx.core as mx

        data = json.dumps(mine, separators=(",", ":")).encode()[:IDENTITY_BYTES]
        row = mx.array(list(data) + [0] * (IDENTITY_BYTES - len(data)), dtype=mx.int32).reshape(1, -1)
        out = mx.distributed.all_gather(row, group=self.group)
        mx.eval(out)
        return [json.loads(bytes(b for b in r if b)) for r in out.tolist()]


class Watchdog:
    """Calls `on_lost(reason)` once when a meeting outlasts its limit (a peer hung)."""

    def __init__(self, on_lost):
        self._on_lost = on_lost
        self._deadline: float | None = None
        self._what = ""
        self._fired = False
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="rank-watchdog", daemon=True).start()

    @contextmanager
    def meeting(self, what: str, seconds: float):
        with self._lock:
            self._deadline, self._what = time.monotonic() + seconds, f"{what} (limit {seconds:g} s)"
        try:
            yield
        finally:
            with self._lock:
                self._deadline = None

    def _watch(self) -> None:
        while not self._fired:
            time.sleep(0.2)
            with self._lock:
                late = self._deadline is not None and time.monotonic() > self._deadline
                what = self._what
            if late:
                self._fired = True
                self._on_lost(f"a peer rank did not answer: {what}")


def shard_target(group, strategy: str):
    """The `prepare_target` for `build_engine`: mlx-lm's own sharding of the lazily loaded model."""

    def prepare(model) -> None:
        if strategy == "tensor":
            if not hasattr(model, "shard"):
                raise ValueError(f"mlx-lm's `{type(model).__module__}` has no tensor-parallel `shard`; use strategy `pipeline` or another model")
            model.shard(group)
        else:
            lm = getattr(model, "language_model", model)
            body = getattr(lm, "model", None)
            if not hasattr(body, "pipeline"):
                raise ValueError(f"mlx-lm's `{type(model).__module__}` has no `pipeline`; use strategy `tensor` or another model")
            body.pipeline(group)

    return prepare


def load_engine(config: WorkerConfig, group, strategy: str):
    """This rank's engine and scheduler (`loading.build_engine`, as one host builds them): its part of
    the target, the drafter whole, no prefix cache, and rank 0's agreement."""
    from mtpstack.worker.loading import build_engine, prepare_depth_policy

    engine, scheduler = build_engine(config, prepare_target=shard_target(group, strategy), prefix_cache=False)
    lm = getattr(engine.target.model, "language_model", engine.target.model)
    sharding = getattr(lm, "sharding_group", None)
    if sharding is not None:
        # A tensor-sharded LM head computes a slice of the vocabulary; mlx-lm's own model gathers
        # the slices in its `__call__`, which the engine bypasses (it needs the hidden state too).
        from mlx_lm.models.base import gather_last_axis

        head = engine.parts.lm_head
        engine.parts.lm_head = lambda h: gather_last_axis(head(h), sharding)
    engine.agree = Channel(group).agree
    prepare_depth_policy(engine, config)
    return engine, scheduler


def describe_rank(rank: int, engine) -> dict:
    """What `/identity` lists for one rank: its process, host and weight proof."""
    return {
        "rank": rank,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "weights": {
            "target": engine.target.sha256,
            "drafter": engine.drafter.sha256 if engine.drafter is not None else None,
        },
    }


def _sequence_message(seq, sid: int) -> dict:
    """What a follower needs to run a sequence alike: its prompt and settings. Its sampled tokens
    come from rank 0 (`Channel.agree`), so a follower's own random draws never matter."""
    return {"id": sid, "prompt": seq.prompt, "params": asdict(seq.params)}


class DistributedGenerationLoop(GenerationLoop):
    """Rank 0's generation thread: the usual loop, telling the other ranks every step it takes."""

    def __init__(self, config: WorkerConfig, metrics, loop):
        super().__init__(config, metrics, loop)
        self.setting = RankSetting.from_environ(config.distributed_backend, config.distributed_strategy)
        self.lost: str | None = None
        self.channel: Channel | None = None
        self.watchdog: Watchdog | None = None
        self._ids: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # sequence -> the id the other ranks know it by
        self._next_id = 0
        self._last_meeting = time.monotonic()

    @property
    def alive(self) -> bool:
        return super().alive and self.lost is None

    def _load(self) -> None:
        from mtpstack.worker.identity import build_identity

        started = time.monotonic()
        group = join_group(self.setting)
        self.channel = Channel(group)
        self.engine, self.scheduler = load_engine(self.config, group, self.setting.strategy)
        self.watchdog = Watchdog(lambda why: self._lose(why, stuck=True))
        with self.watchdog.meeting("the ranks' first meeting after loading", LOAD_MEETING_SECONDS):
            ranks = self.channel.gather(describe_rank(0, self.engine))
        self.identity = {
            **build_identity(self.config, self.engine),
            "prefix_cache": {"max_gib": 0, "max_bytes": 0},
            "distributed": {"backend": self.setting.backend, "strategy": self.setting.strategy, "size": self.setting.size},
            "ranks": ranks,
        }
        self.metrics.drafter_info(self.engine)
        self._last_meeting = time.monotonic()
        log.info("loaded `%s` as rank 0 of %d (%s, %s) in %.2f s", self.config.model, self.setting.size,
                 self.setting.backend, self.setting.strategy, time.monotonic() - started)

    def _loop(self) -> None:
        try:
            super()._loop()
        except BaseException as e:
            self._lose(f"{type(e).__name__}: {e}", stuck=False)
            raise
        # A clean stop: the other ranks stop too.
        with self.watchdog.meeting("the stop", PEER_TIMEOUT_SECONDS):
            self.channel.broadcast({"stop": True})

    def _meet(self, step: bool) -> tuple[int | None, int | None]:
        """Tell the other ranks what runs next; returns the step's prefill budget (rank 0's pacer decides
        it for every rank, so their chunks are the same) and its draft depth where rows are `auto`."""
        sched = self.scheduler
        added, alive = [], []
        for seq in sched.active:
            sid = self._ids.get(seq)
            if sid is None:
                sid = self._ids[seq] = self._next_id
                self._next_id += 1
                added.append(_sequence_message(seq, sid))
            else:
                alive.append(sid)
        budget = sched.pacer.budget_tokens() if step else None  # 0: no prefill this step
        # The draft depth of `auto` rows: rank 0's policy picks it from its own step times, for every rank.
        depth = sched.batch.choose_depth() if step and sched.batch is not None else None
        with self.watchdog.meeting("the step's announcement", PEER_TIMEOUT_SECONDS):
            self.channel.broadcast({"alive": alive, "add": added, "step": step, "budget": budget, "depth": depth})
        self._last_meeting = time.monotonic()
        return budget, depth

    def _step(self) -> list:
        budget, depth = self._meet(step=True)
        with self.watchdog.meeting("a step", self.config.stall_seconds):
            return self.scheduler.step(budget, depth)

    def _idle(self) -> None:
        if time.monotonic() - self._last_meeting >= IDLE_MEETING_SECONDS:
            self._meet(step=False)

    def _lose(self, reason: str, stuck: bool) -> None:
        """A peer is gone: 503 from now on, an error for every request in flight, then exit."""
        if self.lost is not None:
            return
        self.lost = reason
        log.error("the distributed worker lost a rank: %s; exiting so the service manager restarts it", reason)
        if stuck:  # the generation thread is blocked in a collective: answer its requests from here
            pending = list(self.scheduler.active) if self.scheduler is not None else []
            while not self.inbox.empty():
                pending.append(self.inbox.get_nowait().seq)
            for seq in pending:
                if seq.handle is not None:
                    self.loop.call_soon_threadsafe(seq.handle.deliver, Event("", "error", f"a rank of this worker was lost: {reason}"))
        threading.Timer(EXIT_GRACE_SECONDS, _exit, args=(1,)).start()


def _exit(code: int) -> None:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def follow(config: WorkerConfig) -> int:
    """A rank other than 0: load its part, then run every step rank 0 announces, until told to stop."""
    from mtpstack.worker.sequence import SamplingParams

    setting = RankSetting.from_environ(config.distributed_backend, config.distributed_strategy)
    group = join_group(setting)
    channel = Channel(group)
    try:
        engine, sched = load_engine(config, group, setting.strategy)
    except (ValueError, FileNotFoundError) as e:
        raise UserError(f"rank {setting.rank} failed to load its models: {e}") from None

    def lost(why: str) -> None:
        log.error("rank %d lost rank 0 or a peer: %s; exiting", setting.rank, why)
        _exit(1)

    watchdog = Watchdog(lost)
    with watchdog.meeting("the ranks' first meeting after loading", LOAD_MEETING_SECONDS):
        channel.gather(describe_rank(setting.rank, engine))
    log.info("loaded `%s` as rank %d of %d (%s, %s)", config.model, setting.rank, setting.size, setting.backend, setting.strategy)
    seqs: dict[int, object] = {}
    while True:
        try:
            with watchdog.meeting("rank 0's next word", FOLLOWER_WAIT_SECONDS):
                message = channel.broadcast(None)
            if message.get("stop"):
                log.info("rank %d stops with rank 0", setting.rank)
                return 0
            alive = set(message["alive"])
            for sid, seq in seqs.items():
                if sid not in alive:
                    seq.cancelled = True
            sched.drop_cancelled()
            for add in message["add"]:
                seq = engine.new_sequence(add["prompt"], SamplingParams(**add["params"]))
                seqs[add["id"]] = seq
                sched.add(seq)
            if message["step"]:
                with watchdog.meeting("a step", config.stall_seconds):
                    sched.step(message.get("budget", 0), message.get("depth"))
            else:
                time.sleep(FOLLOWER_NAP_SECONDS)
            active = {id(s) for s in sched.active}
            seqs = {sid: s for sid, s in seqs.items() if id(s) in active}
        except Exception as e:  # a lost peer fails the collective at once
            lost(f"{type(e).__name__}: {e}")
            return 1
