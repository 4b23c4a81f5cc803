"""`mtpstack bench sweep`: one worker profile measured at several draft depths, by docs/bench.md's "What a sweep
does": each configuration validated, served on a free loopback port, its weights proven and its passes measured, in a
`fresh` process each or all `alternated` in one (paired). `results.json` holds everything raw.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from mtpstack import series
from mtpstack.bench import report as rpt
from mtpstack.bench.parts import git, loadavg, rotated, version_of
from mtpstack.bench.servers import ServerError, stream_chat
from mtpstack.bench.stats import DEFAULT_MARGIN, DEFAULT_MAX_REPEATS, DEFAULT_REPEATS, MIN_PASSES, decide, settling
from mtpstack.errors import UserError
from mtpstack.proxy.prometheus import unlabelled
from mtpstack.runtime import WILDCARD_HOSTS, Process, StartError, free_port, url_of
from mtpstack.validator import DEPTH_AUTO, FleetConfig, WorkerProfile, did_you_mean, format_path, validate_data, weights_from_argv, worker_argv
from mtpstack.worker.launcher import resolve_command, worker_env
from mtpstack.worker.proof import IdentityUnavailable, ProofError, fetch_identity, hash_weights, prove_weights

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
DEFAULT_WORKLOADS = ("code", "prose")
DEFAULT_DEPTHS = "1-6"
DEFAULT_MAX_TOKENS = 128
WARMUP_PASSES = 1
#: Loading a large model from a cold page cache takes minutes.
DEFAULT_STARTUP_TIMEOUT = 600.0
#: One request may not stall longer than this between two chunks.
READ_TIMEOUT = 300.0
BENCH_HOST = "127.0.0.1"
#: The worker's counters a pass reads before and after (target steps: one per batched decode forward).
COUNTERS = (series.TOKENS_DRAFTED, series.TOKENS_ACCEPTED, series.TARGET_STEPS)
DESIGNS = ("auto", "alternated", "fresh")


class SweepError(UserError):
    """Stops the whole sweep."""


class ConfigurationAborted(Exception):
    """Stops one configuration (not proven, not started or not answering)."""


class ProcessReused(SweepError):
    pass


@dataclass(frozen=True)
class Prompt:
    id: str
    prompt: str
    #: Request fields beside the message (a tool-call turn's `tools`), as the line gives them.
    body: dict | None = field(default=None, hash=False, compare=False)


def load_prompts(workload: str, prompts_dir: Path | None = None) -> list[Prompt]:
    folder = Path(prompts_dir or PROMPTS_DIR)
    path = folder / f"{workload}.jsonl"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.jsonl"))) or "none"
        raise SweepError(f"no prompt set for workload `{workload}`: `{path}`", f"known workloads: {known}")
    prompts = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            body = rec.get("body")
            if body is not None and not isinstance(body, dict):
                raise TypeError
            prompts.append(Prompt(str(rec["id"]), str(rec["prompt"]), body))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SweepError(f"bad prompt line in `{path}` at line {i}",
                             'each line is `{"id": "...", "prompt": "..."}`, with an optional `"body": {...}`') from None
    if not prompts:
        raise SweepError(f"the prompt set `{path}` is empty")
    return prompts


def parse_depths(text: str) -> list[int]:
    """`1-6`, `1,2,4`, `2-4,6` -> sorted unique depths."""
    depths: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                depths.update(range(lo, hi + 1))
            elif part:
                depths.add(int(part))
    except ValueError:
        raise SweepError(f"cannot read the depths: `{text}`", "write a range or a list, e.g. `1-6` or `1,2,4`") from None
    if not depths:
        raise SweepError(f"no depths given: `{text}`")
    return sorted(depths)


def parse_widths(text: str, batch_width: int) -> list[int]:
    """`1,2,4` -> [1, 2, 4], each from 1 to the worker's own batch width."""
    try:
        widths = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SweepError(f"cannot read `--widths {text}`", "write it as `1,2,4`") from None
    if not widths or widths[0] < 1 or widths[-1] > batch_width:
        raise SweepError(f"`--widths {text}` must lie between 1 and the worker's batch width {batch_width}",
                         f"drop the widths above {batch_width}, or sweep a worker with `maxNumSeqs` that wide")
    return widths


@dataclass(frozen=True)
class Configuration:
    label: str
    depth: int | str | None  # None: no drafter; "auto": the worker's adaptive depth

    @staticmethod
    def of(depth: int | str | None) -> Configuration:
        return Configuration("no-drafter" if depth is None else f"depth {depth}", depth)

    @property
    def request_fields(self) -> dict | None:
        """What a request carries in a worker serving every configuration (`auto`: nothing)."""
        return {"num_draft_tokens": self.depth} if isinstance(self.depth, int) else None


def alternated_profile(profile: WorkerProfile, configs: Sequence[Configuration]) -> WorkerProfile:
    """The one worker of an alternated sweep: at the deepest fixed depth, or at `auto` with a `maxDepth` reaching it
    (a request's `num_draft_tokens` lowers its depth, never raises it)."""
    fixed = [c.depth for c in configs if isinstance(c.depth, int)]
    if not any(c.depth == DEPTH_AUTO for c in configs):
        return with_depth(profile, max(fixed))
    assert profile.drafter is not None
    return with_depth(profile, DEPTH_AUTO, max_depth=max([profile.drafter.max_depth, *fixed]))


def with_depth(profile: WorkerProfile, depth: int | str | None, **drafter) -> WorkerProfile:
    """`profile` drafting at `depth` (None: without its drafter), `drafter` its other fields changed."""
    if depth is None:
        return profile.model_copy(update={"drafter": None})
    assert profile.drafter is not None
    return profile.model_copy(update={"drafter": profile.drafter.model_copy(update={"depth": depth, **drafter})})


def plan(config: FleetConfig, worker: str, depths: Sequence[int], baseline: str) -> tuple[list[Configuration], Configuration]:
    """The configurations to measure, baseline first, and the baseline itself."""
    if worker not in config.workers:
        guess = did_you_mean(worker, list(config.workers))
        raise SweepError(f"no worker named `{worker}` in the config", f"did you mean `{guess}`?" if guess
                         else "known workers: " + ", ".join(f"`{w}`" for w in config.workers))
    profile = config.workers[worker]
    if profile.drafter is None:
        raise SweepError(f"worker `{worker}` has no drafter, so there is no draft depth to sweep",
                         f"add a `drafter` to `workers.{worker}` in the config")
    if baseline not in ("no-drafter", "configured"):
        raise SweepError(f"unknown baseline: `{baseline}`", "use `no-drafter` or `configured`")
    # A depth per class is swept as its `default` depth; each configuration then drafts one depth for all.
    base = Configuration.of(None if baseline == "no-drafter" else profile.drafter.default_depth)
    return [base, *(Configuration.of(d) for d in depths if Configuration.of(d) != base)], base


def choose_design(asked: str, configs: Sequence[Configuration], profile: WorkerProfile) -> tuple[str, str]:
    """The design a sweep runs and why: paired passes decide far sooner (docs/bench.md), but only for settings a
    request carries: every configuration a depth, on the native worker."""
    restart = []
    if any(c.depth is None for c in configs):
        restart.append("the `no-drafter` baseline needs a worker without a drafter")
    if profile.backend != "native":
        restart.append(f"the `{profile.backend}` backend takes no depth per request")
    if asked == "alternated" and restart:
        raise SweepError(f"`--design alternated` needs every configuration to be a depth a request can carry: {'; '.join(restart)}",
                         "use `--baseline configured` on a native worker, or `--design fresh` for a fresh process per configuration")
    if asked != "auto":
        return asked, f"asked for (`--design {asked}`)"
    if restart:
        return "fresh", "a fresh worker per configuration: " + "; ".join(restart)
    return "alternated", "every configuration is a depth a request carries (`num_draft_tokens`), so one worker serves all, paired"


def check_reachable(config: FleetConfig, worker: str, c: Configuration, source_name: str) -> None:
    """Step 1: the fleet, with this configuration applied, must pass the validator."""
    data = config.model_dump(by_alias=True, mode="json")
    drafter = data["workers"][worker]["drafter"]
    data["workers"][worker]["drafter"] = None if c.depth is None else {**drafter, "depth": c.depth}
    _, report = validate_data(data, source_name)
    if report.errors:
        f = report.errors[0]
        where = format_path(f.path)
        raise SweepError(f"configuration `{c.label}` is forbidden by the fleet's rules: {f.code}: {where}: {f.message}",
                         f.hint or f"sweep only depths the config allows (rule `{f.code}`)")


def fleet_ports(config: FleetConfig) -> set[tuple[str, int]]:
    return {(w.host, w.port) for w in config.workers.values()} | {(config.proxy.host, config.proxy.port)}


def ensure_isolated(config: FleetConfig, host: str, port: int) -> None:
    """Step 2: never measure on a port a fleet member listens on (it may be taking traffic)."""
    for h, p in fleet_ports(config):
        if p == port and (h == host or h in WILDCARD_HOSTS or host in WILDCARD_HOSTS):
            raise SweepError(f"refusing to bench on port {port}: it belongs to the fleet (`{h}:{p}`)",
                             "the bench serves each configuration on its own free loopback port; stop whatever else picked it")


def pick_port(config: FleetConfig, host: str = BENCH_HOST) -> int:
    """A free port no fleet member uses (refused, should twenty tries all hit one)."""
    taken = {p for _, p in fleet_ports(config)}
    for _ in range(20):
        port = free_port(host)
        if port not in taken:
            break
    ensure_isolated(config, host, port)
    return port


def local_hash(path: str) -> str | None:
    """A local model directory's content hash (None for a hub id)."""
    p = Path(path).expanduser()
    return hash_weights(p) if p.is_dir() else None


@dataclass
class Expected:
    profile: WorkerProfile
    target_sha256: str | None
    drafter_sha256: str | None


def _declared_kind(profile: WorkerProfile) -> str | None:
    return profile.drafter.kind if profile.drafter is not None else None


#: How the sweep names a disagreement of the proof: the item, and where it was found.
_SWEEP_NAMES = {("target", "/identity"): "target path", ("drafter", "/identity"): "drafter path", ("depth", "/identity"): "draft depth",
                ("depth", "command line"): "draft depth"}


def check_weights(pid: int, url: str, expected: Expected, *, fetch: Callable[[str], dict] | None = None) -> dict:
    """The weights proof (`prove_weights`) of a running worker against `expected`, for results.json;
    `ConfigurationAborted` listing every mismatch."""
    profile = expected.profile
    try:
        proof = prove_weights(pid, url, asked=weights_from_argv(worker_argv(profile)), fetch=fetch,
                              expected_sha256={"target": expected.target_sha256, "drafter": expected.drafter_sha256})
    except IdentityUnavailable as e:
        raise ConfigurationAborted(f"cannot read `{url}/identity`: {e.__cause__ or e}") from None
    except ProofError as e:
        raise ConfigurationAborted(f"cannot read the worker's command line (pid {pid}): {e.__cause__ or e}") from None
    if not proof.proved:
        raise ConfigurationAborted("the weights proof failed: " + "; ".join(
            f"{_SWEEP_NAMES.get((m.what, m.at), m.what)} ({m.at}): asked for {m.want!r}, the process has {m.got!r}"
            for m in proof.mismatches))
    drafter = profile.drafter
    return {"cmdline": proof.argv, "claim": asdict(proof.claim), "identity": proof.identity,
            "drafter_kind": proof.resolved_kind or _declared_kind(profile), "expected": {
                "target": profile.target.path, "target_sha256": expected.target_sha256,
                "drafter": drafter.path if drafter else None, "drafter_sha256": expected.drafter_sha256,
                "depth": drafter.default_depth if drafter else None}}


def process_key(proc: Process, native: bool) -> tuple[int, str]:
    """A process's pid and start time, from a native worker's `/identity`, else /proc/PID/stat field 22."""
    try:
        started = fetch_identity(proc.url).get("started_at") if native else None
    except Exception:  # noqa: BLE001 - the weights proof that follows reports it properly
        started = None
    if started is not None:
        return proc.pid, f"{float(started):.6f}"
    try:
        return proc.pid, "ticks:" + Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return proc.pid, "unknown"


async def scrape(session: aiohttp.ClientSession, url: str, counters: Sequence[str] = COUNTERS) -> dict[str, float]:
    """The worker's `counters` now (none from a server without `/metrics`)."""
    async with session.get(url + "/metrics") as resp:
        if resp.status != 200:
            return {}
        return unlabelled(await resp.text(), counters)


async def run_request(session: aiohttp.ClientSession, url: str, model: str, prompt: Prompt, max_tokens: int,
                      extra: dict | None = None) -> dict:
    """One greedy streamed chat completion, every chunk timed."""
    times: list[float] = []
    body = {**(prompt.body or {}), **(extra or {}), "seed": 0}
    try:
        r = await stream_chat(session, url, model, [{"role": "user", "content": prompt.prompt}], max_tokens, times,
                              extra=body, ignore_eos=None, tool_text=True)
    except ServerError as e:  # an error answer, or an error event in the stream
        raise ConfigurationAborted(f"prompt `{prompt.id}`: {e}") from None
    usage = r["usage"]
    return {
        "prompt_id": prompt.id,
        # Without a usage chunk, count the chunks: exact for servers that send one token per chunk.
        "tokens": int(usage.get("completion_tokens", len(times))),
        "seconds": r["end"] - r["sent"],
        "ttft_s": None if r["empty"] else r["ttft_s"],
        "decode_s": times[-1] - times[0] if times else 0.0,
        "output_sha256": hashlib.sha256(r["text"].encode()).hexdigest(),
        "draft_tokens": usage.get("draft_tokens"),
        "accepted_draft_tokens": usage.get("accepted_draft_tokens"),
    }


def summarize_pass(requests: list[dict], before: dict[str, float], after: dict[str, float]) -> dict:
    tokens = sum(r["tokens"] for r in requests)
    seconds = sum(r["seconds"] for r in requests)
    decode_s = sum(r["decode_s"] for r in requests)
    decode_tokens = sum(max(r["tokens"] - 1, 0) for r in requests)
    ttfts = sorted(r["ttft_s"] for r in requests if r["ttft_s"] is not None)
    # A worker without a counter (an older one, mlx_lm.server) gives None, not 0.
    drafted, accepted, steps = (after[k] - before.get(k, 0.0) if k in after else None for k in COUNTERS)
    return {
        "tokens": tokens,
        "seconds": seconds,
        "e2e_tps": tokens / seconds if seconds > 0 else None,
        "decode_tps": decode_tokens / decode_s if decode_s > 0 else None,
        "ttft_s": ttfts[len(ttfts) // 2] if ttfts else None,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": (accepted / drafted) if drafted else None,
        "target_steps": steps,
        # Decode time per target step: every decode second of the pass over its batched forwards.
        "step_ms": 1000.0 * decode_s / steps if steps else None,
        "requests": requests,
    }


async def run_pass(session: aiohttp.ClientSession, url: str, model: str, prompts: Sequence[Prompt], max_tokens: int,
                   clients: int = 1, extra: dict | None = None) -> dict:
    """Every prompt once, by `clients` clients taking them from one queue one at a time; beyond one client tok/s
    is aggregate (tokens over the pass's wall time)."""
    before = await scrape(session, url)
    todo = list(prompts)
    done: list[dict] = []

    async def client() -> None:
        while todo:
            done.append(await run_request(session, url, model, todo.pop(0), max_tokens, extra))

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.monotonic() - started
    after = await scrape(session, url)
    order = {p.id: i for i, p in enumerate(prompts)}
    out = summarize_pass(sorted(done, key=lambda r: order.get(r["prompt_id"], 0)), before, after)
    if clients > 1:
        out.update(clients=clients, wall_seconds=wall, e2e_tps=out["tokens"] / wall if wall > 0 else None)
    return out


@dataclass
class SweepSettings:
    config_file: str
    worker: str
    depths: list[int]
    baseline: str = "configured"
    repeats: int = DEFAULT_REPEATS
    max_repeats: int = DEFAULT_MAX_REPEATS
    workloads: list[str] = field(default_factory=lambda: list(DEFAULT_WORKLOADS))
    out: Path = Path("bench-out")
    max_tokens: int = DEFAULT_MAX_TOKENS
    margin: float = DEFAULT_MARGIN
    prompts_dir: Path | None = None
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    widths: list[int] = field(default_factory=lambda: [1])
    design: str = "auto"


def git_revision() -> str | None:
    """The checkout's commit, `-dirty` when tracked files changed."""
    rev, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    return None if rev is None else rev.strip() + ("-dirty" if (dirty or "").strip() else "")


def start_worker(profile: WorkerProfile, log_path: Path, name: str) -> Process:
    """A worker serving `profile` as a deploy renders it, started, not waited for."""
    return Process(resolve_command(worker_argv(profile)), log_path=log_path, name=name, kind="worker",
                   url=url_of(profile.host, profile.port), env=worker_env()).start()


class Sweep:
    """One sweep. `launch` is the single place a worker process is made (tests override it)."""

    def __init__(self, config: FleetConfig, settings: SweepSettings, *, progress=None,
                 log: Callable[[str], None] | None = None):
        self.config = config
        self.s = settings
        self.progress = progress
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.profile = config.workers.get(settings.worker)
        self.seen: dict[tuple[int, str], str] = {}
        #: The weights' hashes, from disk, else as the first worker reported them (a hub id cannot be hashed here).
        self.hashes: dict[str, str | None] = {}
        self.results: dict = {}
        self._task = None

    def launch(self, profile: WorkerProfile, label: str) -> Process:
        return start_worker(profile, self.s.out / "logs" / f"{label.replace(' ', '-')}.log", f"bench {label}")

    def stop(self, proc: Process) -> None:
        proc.stop()

    def _progress(self, *, advance: int = 0, grow: int = 0, description: str | None = None) -> None:
        """The bar, when there is one: passes run, passes added while a verdict is open, what runs now."""
        if self.progress is not None and self._task is not None:
            task = next(t for t in self.progress.tasks if t.id == self._task)
            self.progress.update(self._task, advance=advance, total=(task.total or 0) + grow,
                                 description=description or task.description)

    def write(self) -> None:
        self.s.out.mkdir(parents=True, exist_ok=True)
        tmp = self.s.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1))
        tmp.replace(self.s.out / "results.json")

    def run(self) -> dict:
        s = self.s
        configs, base = plan(self.config, s.worker, s.depths, s.baseline)
        for c in configs:
            check_reachable(self.config, s.worker, c, s.config_file)
        if s.repeats < 1 or s.max_repeats < s.repeats:
            raise SweepError(f"`--max-repeats` ({s.max_repeats}) must be at least `--repeats` ({s.repeats}),"
                             " which must be at least 1")
        prompts = {w: load_prompts(w, s.prompts_dir) for w in s.workloads}
        if s.repeats < MIN_PASSES:
            self.log(f"warning: with {s.repeats} passes per configuration no ratio can be printed (at least"
                     f" {MIN_PASSES} per side)\n\nhint: rerun with `--repeats {MIN_PASSES}` or more")
        assert self.profile is not None and self.profile.drafter is not None
        try:
            self.hashes = {"target": local_hash(self.profile.target.path),
                           "drafter": local_hash(self.profile.drafter.path)}
        except FileNotFoundError as e:
            raise SweepError(f"cannot hash the weights: {e}",
                             "point `target.path` and `drafter.path` at model directories") from None
        self.results = self._header(base, prompts)
        design, why = choose_design(s.design, configs, self.profile)
        self.results["settings"].update(design=design, design_reason=why)
        self.log(f"design: {design}: {why}")
        if self.progress is not None:
            self._task = self.progress.add_task(
                "sweep", total=len(configs) * len(s.workloads) * len(s.widths) * (WARMUP_PASSES + s.repeats))
        try:
            # Alternated: one worker serves every configuration; fresh: a worker each, one after another.
            for group in [configs] if design == "alternated" else [[c] for c in configs]:
                for record in asyncio.run(self._serve(group, prompts)):
                    self.results["configurations"].append(record)
                    if record["status"] != "measured":
                        self.log(f"error: configuration `{record['label']}` aborted: {record['error']}")
                    self.write()
        except BaseException as e:
            # Keep what was measured; say why the sweep stopped.
            self.results["meta"]["stopped"] = getattr(e, "message", None) or type(e).__name__
            self.write()
            raise
        self.results["meta"]["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.results["meta"]["load_average_end"] = loadavg()
        self.write()
        return self.results

    def _header(self, base: Configuration, prompts: dict[str, list[Prompt]]) -> dict:
        """results.json before any configuration: what ran where, and with which settings."""
        s = self.s
        assert self.profile is not None
        digest = {w: hashlib.sha256(json.dumps([asdict(x) for x in p]).encode()).hexdigest() for w, p in prompts.items()}
        return {
            "schema": rpt.SCHEMA,
            "meta": {
                "worker": s.worker, "config_file": s.config_file, "host": socket.gethostname(),
                "platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                "load_average_start": loadavg(),
                "client_versions": {"aiohttp": aiohttp.__version__, "numpy": version_of("numpy")},
                "git_revision": git_revision(),
                "command": ["mtpstack", *sys.argv[1:]] if sys.argv and "mtpstack" in Path(sys.argv[0]).name else None,
                "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "profile": self.profile.model_dump(by_alias=True, mode="json"),
            },
            "settings": {
                "depths": s.depths, "widths": s.widths, "repeats": s.repeats, "max_repeats": s.max_repeats,
                "warmup": WARMUP_PASSES, "workloads": s.workloads, "max_tokens": s.max_tokens, "margin": s.margin,
                "endpoint": "/v1/chat/completions",
                "prompts": {w: {"count": len(p), "sha256": digest[w]} for w, p in prompts.items()},
            },
            "baseline": base.label,
            "configurations": [],
        }

    async def _serve(self, configs: list[Configuration], prompts: dict[str, list[Prompt]]) -> list[dict]:
        """One worker on a free loopback port serving `configs` (a record each, sharing one `process`): started,
        proven, measured per width and workload; a failure to start, to prove or to answer is every record's error."""
        shared = len(configs) > 1
        label = "alternated" if shared else configs[0].label
        port = pick_port(self.config)
        profile = alternated_profile(self.profile, configs) if shared else with_depth(self.profile, configs[0].depth)
        profile = profile.model_copy(update={"host": BENCH_HOST, "port": port})
        process = {"port": port, **({"shared": True} if shared else {})}
        records = [{"label": c.label, "depth": c.depth, "drafter_kind": _declared_kind(profile), "status": "aborted",
                    "error": None, "argv": worker_argv(profile), "process": process, "proof": None,
                    "workloads": {}} for c in configs]
        self._progress(description=f"{label}: starting")
        proc = self.launch(profile, label)
        process.update({"pid": proc.pid, "log": str(proc.log_path)})
        try:
            proc.wait_ready("/health", self.s.startup_timeout, state="healthy")
            model = self._proven(proc, profile, records, label)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=READ_TIMEOUT)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for width in self.s.widths:
                    for w in self.s.workloads:
                        key = rpt.workload_key(w, width)
                        self._progress(description=f"{label}: {key}")
                        await self._passes(session, proc.url, model, prompts[w], width, key, configs, records)
            error = None
        except (StartError, ConfigurationAborted) as e:
            error = str(e)
        except aiohttp.ClientError as e:
            error = f"the worker stopped answering: {e}"
        finally:
            self.stop(proc)
        for r in records:
            r.update(status="aborted" if error is not None else "measured", error=error)
        return records

    def _proven(self, proc: Process, profile: WorkerProfile, records: list[dict], label: str) -> str:
        """A started worker proven new (a reused one would carry counters and caches over), then its weights, the
        proof kept in its records, what it reports of its machine in the meta; the model name it serves."""
        key = process_key(proc, profile.backend == "native")
        records[0]["process"].update({"started_at": key[1], "launched_at": proc.started_at})
        if key in self.seen:
            raise ProcessReused(f"configurations `{self.seen[key]}` and `{label}` were served by the same process"
                                f" (pid {key[0]}, started {key[1]})", "each configuration needs a fresh worker;"
                                " a server's counters and caches carry over otherwise")
        self.seen[key] = label
        proof = check_weights(proc.pid, proc.url, Expected(profile, self.hashes["target"], self.hashes["drafter"]))
        ident = proof["identity"] or {}
        for k in ("device", "blas", "versions"):
            if ident.get(k) is not None:
                self.results["meta"].setdefault(k, ident[k])
        for role in ("target", "drafter"):
            self.hashes[role] = self.hashes[role] or (ident.get(role) or {}).get("sha256") or None
        for r in records:
            r.update(proof=proof, drafter_kind=proof["drafter_kind"])
        # mlx_lm.server serves its model under the path it was given (another name makes it load that model).
        return ident.get("served_model_name") or (profile.target.path if profile.backend == "mlx-lm" else profile.model)

    async def _passes(self, session: aiohttp.ClientSession, url: str, model: str, prompts: list[Prompt], width: int,
                      key: str, configs: list[Configuration], records: list[dict]) -> None:
        """A discarded warm-up pass of each configuration, then rounds in rotating order, more while `_open`."""
        s = self.s
        cells = [r["workloads"].setdefault(key, {"warmup": None, "passes": [], "clients": width}) for r in records]

        async def one(i: int) -> dict:
            extra = configs[i].request_fields if len(configs) > 1 else None
            out = await run_pass(session, url, model, prompts, s.max_tokens, width, extra)
            self._progress(advance=1)
            return out

        for i, cell in enumerate(cells):
            cell["warmup"] = await one(i)
        rounds = 0
        while rounds < s.max_repeats and (rounds < s.repeats or self._open(configs, records, key)):
            if rounds >= s.repeats:
                self._progress(grow=len(configs))
            for i in rotated(list(range(len(configs))), rounds):
                cells[i]["passes"].append(await one(i))
            rounds += 1

    def _open(self, configs: list[Configuration], records: list[dict], key: str) -> bool:
        """More passes can decide something: a verdict against the baseline is open, or the comparison settling the
        recommendation is undecided (fresh: one this configuration is a side of, among what is measured so far)."""
        paired = len(configs) > 1
        pool = records if paired else [*(c for c in self.results["configurations"] if c["status"] == "measured"),
                                       *records]
        base_record = next((r for r in pool if r["label"] == self.results["baseline"]), None)
        mine = [rpt.candidate(r, key) for r in records if r is not base_record]
        if base_record is None or not mine:
            return False
        base, kw = rpt.candidate(base_record, key), {"margin": self.s.margin, "paired": paired}
        # Alternated asks of every configuration each round: with fewer resamples.
        if any(decide(base.values, c.values, **kw, **({"resamples": 1000} if paired else {})).open for c in mine):
            return True
        others = [rpt.candidate(r, key) for r in pool if r is not base_record]
        settled = settling(base, others, resamples=1000, **kw)
        return (settled is not None and not settled.decided
                and (paired or any(c in (settled.recommended, settled.best) for c in mine)))


def write_outputs(results: dict, out: Path) -> list[Path]:
    """report.md and sweep.png next to results.json."""
    out.mkdir(parents=True, exist_ok=True)
    report_path = out / "report.md"
    report_path.write_text("\n".join(rpt.render_report(results)) + "\n")
    paths = [out / "results.json", report_path]
    if rpt.measured(results):
        paths.append(rpt.plot_sweep(results, out / "sweep.png"))
    return paths
