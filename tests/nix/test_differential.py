"""Nix and Python agree on random fleets: the same coupling verdict, the same
placement verdicts (errors, warnings, the parts each host runs, the address the
proxy dials), the same worker argv (also as systemd's ExecStart and launchd's
ProgramArguments), and the same rendered config. Hypothesis draws the fleets; all of
them go to Nix in one JSON file, so hundreds of fleets cost one evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpstack.validator import WORKER_SETTINGS
from mtpstack.validator.argv import worker_argv
from mtpstack.validator.coupling import is_coupled
from mtpstack.validator.load import validate_data
from mtpstack.validator.placement import dial_host, parts_on, rank_peers
from mtpstack.worker.launcher import rank_environments

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.nix
N_FLEETS = 250

# Values within the module's option types.
widths = st.integers(1, 4)
models = st.sampled_from(["qwen3.8-27b", "qwen3-4b", "llama", "m.x-1", "é-model"])
bits = st.sampled_from([2, 3, 4, 5, 6, 8, "mxfp4", "bf16", "fp16", "fp32"])
# Arguments with spaces, quotes, `%`, `$` and non-ASCII: no NUL (Nix strings cannot hold it).
args = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12)
worker_names = st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True)
seconds = st.sampled_from([0.5, 1, 2.5, 30, 60.0, 300])
gib = st.one_of(st.integers(0, 65536), st.sampled_from([0.0, 0.5, 1.25, 2.0, 0.1, 100.75, 65536.0]))
#: Host names a fleet may declare; `mac-1` is also drawn undeclared (a typo of `mac1`).
HOST_NAMES = ["gw", "mac1", "mac2"]
deploy_on = st.sampled_from([None, *HOST_NAMES, "mac-1"])
PLACEMENT_CODES = {
    "unknown-host", "proxy-not-placed", "worker-unreachable",
    "distributed-deploy-on", "distributed-duplicate-host", "distributed-needs-native", "distributed-needs-ip",
    "distributed-ibv-devices",
}
#: Host addresses: IPv4, IPv6, a name, and two that only look like IPv4 (MLX's backends take neither).
ADDRESSES = ["10.0.0.1", "fd00::2", "mac1.lan", "[10.0.0.3]", "010.0.0.4"]


def optional(key: str, strategy: st.SearchStrategy) -> st.SearchStrategy:
    """A one-key dict or an empty one: the option left at its default."""
    return st.one_of(st.just({}), strategy.map(lambda v: {key: v}))


@st.composite
def ibv_devices(draw, n: int) -> list:
    """JACCL's device matrix for `n` ranks: mostly well formed (null on the diagonal, a name or a
    list of names elsewhere), else a row too many or too few, or a device toward the rank itself."""
    device = st.one_of(st.sampled_from(["rdma_en2", "rdma_en3"]), st.lists(st.sampled_from(["rdma_en4", "rdma_en5"]), min_size=1, max_size=2))
    rows = [[None if c == r else draw(device) for c in range(n)] for r in range(n)]
    flaw = draw(st.sampled_from([None, None, "rows", "diagonal", "short"]))
    if flaw == "rows":
        rows = rows[:-1] if draw(st.booleans()) else rows + [rows[0]]
    elif flaw == "diagonal":
        r = draw(st.integers(0, n - 1))
        rows[r][r] = "rdma_en2"
    elif flaw == "short":
        rows[draw(st.integers(0, n - 1))].pop()
    return rows


@st.composite
def distributed(draw) -> dict:
    """A worker spanning 2-3 hosts (a host may repeat or be undeclared); the rank ports near either end of the range."""
    d = draw(st.fixed_dictionaries(
        {"hosts": st.lists(st.sampled_from([*HOST_NAMES, "mac-1"]), min_size=2, max_size=3)},
        optional={
            "backend": st.sampled_from(["ring", "jaccl"]),
            "strategy": st.sampled_from(["tensor", "pipeline"]),
            "basePort": st.one_of(st.none(), st.integers(1, 65535)),
        },
    ))
    d.update(draw(optional("ibvDevices", st.one_of(st.none(), ibv_devices(len(d["hosts"]))))))
    return d


@st.composite
def workers(draw) -> dict:
    w = {
        "model": draw(models),
        "target": {"path": draw(args), "bits": draw(bits)},
        "maxNumSeqs": draw(widths),
        "port": draw(st.one_of(st.integers(1, 65535), st.integers(55530, 55540))),
    }
    depth = st.one_of(st.integers(1, 8), st.just("auto"))
    depth_map = st.dictionaries(st.sampled_from(["code", "prose", "tools", "a.b-c_1"]), depth, max_size=3).map(
        lambda classes: {**classes, "default": classes.get("prose", 3)}
    )
    drafter = st.fixed_dictionaries(
        {"path": args, "bits": bits, "depth": st.one_of(depth, depth_map)},
        optional={"kind": st.sampled_from(["auto", "mtp", "model"]), "maxDepth": st.integers(1, 8)},
    )
    for key, strategy in [
        ("backend", st.sampled_from(["native", "mlx-lm"])),
        ("drafter", st.one_of(st.none(), drafter)),
        ("maxContextTokens", st.one_of(st.none(), st.integers(1, 2**20))),
        ("prefixCache", st.fixed_dictionaries({}, optional={
            "maxGiB": gib, "diskGiB": gib,
            # Absolute paths outside the store (the option's type), with the argument's nasty characters.
            "dir": st.one_of(st.none(), args.map(lambda a: "/" + a)),
        })),
        ("host", st.sampled_from(["127.0.0.1", "0.0.0.0", "::1", "localhost", "[::1]", "LocalHost", "127.0.0.2", "10.0.0.5"])),
        ("extraArgs", st.lists(args, max_size=3)),
        ("deployOn", deploy_on),
        ("distributed", st.one_of(st.none(), distributed())),
    ]:
        w.update(draw(optional(key, strategy)))
    return w


@st.composite
def fleets(draw) -> dict:
    proxy = {}
    proxy.update(draw(optional("concurrencyLimit", widths)))
    proxy.update(draw(optional("modelConcurrencyLimits", st.dictionaries(models, widths, max_size=4))))
    proxy.update(draw(optional("queue", st.fixed_dictionaries({}, optional={"maxWaiting": st.integers(0, 100), "timeoutSeconds": seconds}))))
    proxy.update(draw(optional("timeouts", st.fixed_dictionaries({}, optional={"idleSeconds": seconds, "connectSeconds": seconds, "clientSeconds": seconds}))))
    proxy.update(draw(optional("deployOn", deploy_on)))
    proxy.update(draw(optional("routing", st.sampled_from(["affinity", "first-free"]))))
    proxy.update(draw(optional("affinityWaitSeconds", st.sampled_from([0, 2.5, 10]))))
    tenant = st.fixed_dictionaries({}, optional={
        "maxConcurrent": st.one_of(st.none(), st.integers(1, 20)), "weight": st.integers(1, 1000),
        "requestsPerMinute": st.one_of(st.none(), st.integers(1, 10**6)), "tokensPerMinute": st.one_of(st.none(), st.integers(1, 10**9)),
    })
    proxy.update(draw(optional("tenants", st.dictionaries(st.sampled_from(["alice", "ci.bot-1", "default", "a b", "x" * 65]), tenant, max_size=3))))
    proxy.update(draw(optional("fairQueueing", st.booleans())))
    fleet = {"proxy": proxy, "workers": draw(st.dictionaries(worker_names, workers(), min_size=1, max_size=4))}
    addresses = st.fixed_dictionaries(
        {"address": st.sampled_from(ADDRESSES)}, optional={"memoryGiB": st.sampled_from([16, 64, 0.5])}
    )
    fleet.update(draw(optional("hosts", st.dictionaries(st.sampled_from(HOST_NAMES), addresses, max_size=3))))
    fleet.update(draw(optional("policy", st.fixed_dictionaries({"allowedBackends": st.lists(st.sampled_from(["native", "mlx-lm"]), max_size=2)}))))
    return fleet


def draw_fleets(n: int) -> list[dict]:
    drawn: list[dict] = []

    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(fleets())
    def collect(fleet):
        drawn.append(fleet)

    collect()
    return drawn


def unquote_exec_start(line: str) -> list[str]:
    """Undo the ExecStart quoting: `%%` and `$$` back to one, then one JSON string per argument."""
    text = line.replace("%%", "%").replace("$$", "$")
    decoder, args, i = json.JSONDecoder(), [], 0
    while i < len(text):
        value, i = decoder.raw_decode(text, i)
        args.append(value)
        i += text[i : i + 1] == " "
    return args


#: Fleets that hit each distributed rule for sure, beside the random ones.
PINNED_FLEETS = [
    {
        "proxy": {"deployOn": "gw"},
        "hosts": {"gw": {"address": "10.0.0.1"}, "mac1": {"address": "mac1.lan"}, "mac2": {"address": "fd00::2"}},
        "workers": {
            "a": {"model": "m", "target": {"path": "t", "bits": 4}, "maxNumSeqs": 1, "port": 1, "deployOn": "mac2",
                  "distributed": {"hosts": ["mac1", "mac2", "mac1", "mac-1"]}},
            "b": {"model": "m", "target": {"path": "t", "bits": 4}, "maxNumSeqs": 1, "port": 2, "backend": "mlx-lm",
                  "distributed": {"hosts": ["gw", "mac2"], "backend": "jaccl"}},
            # jaccl: rank 0's IPv6 address refused, rank 1's name not (JACCL dials rank 0 only).
            "c": {"model": "m", "target": {"path": "t", "bits": 4}, "maxNumSeqs": 1, "port": 3,
                  "distributed": {"hosts": ["mac2", "mac1"], "backend": "jaccl", "ibvDevices": [[None, "rdma_en2"], ["rdma_en2"]]}},
            "d": {"model": "m", "target": {"path": "t", "bits": 4}, "maxNumSeqs": 1, "port": 4,
                  "distributed": {"hosts": ["gw", "mac1"], "backend": "jaccl", "ibvDevices": [[None, ["rdma_en3", "rdma_en4"]], ["rdma_en3", None]]}},
        },
    },
    # A well-formed ring across two IPv4 hosts, so each run compares a ring's environment whatever the draw.
    {
        "proxy": {"deployOn": "gw"},
        "hosts": {"gw": {"address": "10.0.0.1"}, "mac1": {"address": "10.0.0.11"}},
        "workers": {
            "r": {"model": "m", "target": {"path": "t", "bits": 4}, "maxNumSeqs": 1, "port": 5, "host": "0.0.0.0",
                  "prefixCache": {"maxGiB": 0}, "distributed": {"hosts": ["mac1", "gw"]}},
        },
    },
]


def test_nix_and_python_agree_on_random_fleets(nixh, tmp_path):
    fleets_ = draw_fleets(N_FLEETS) + PINNED_FLEETS
    assert len(fleets_) >= 200
    data = tmp_path / "fleets.json"
    data.write_text(json.dumps(fleets_))
    results = nixh.eval(
        f"""
        let
          mtp = import {nixh.lib};
          verdict = fleet:
            let config = mtp.render fleet; in
            {{
              rendered = config;
              mismatched = mtp.coupling.mismatched config;
              argv = builtins.mapAttrs (_: mtp.workerArgv) config.workers;
              execStart = builtins.mapAttrs (_: u: u.serviceConfig.ExecStart)
                (mtp.systemd.units {{ inherit config; configFile = "/c"; binDir = "/bin"; }});
              programArguments = builtins.mapAttrs (_: d: d.serviceConfig.ProgramArguments)
                (mtp.launchd.daemons {{ inherit config; configFile = "/c"; binDir = "/bin"; }});
              placementErrors = map (e: {{ inherit (e) code path; }}) (mtp.placement.errors [ ] config);
              placementWarnings = map (w: w.path) (mtp.placement.warnings [ ] config);
              tenantsBeyondFleet = mtp.tenants.beyondFleet config;
              tenantNames = mtp.tenants.badNames config;
              partsOn = builtins.listToAttrs (map (h: {{ name = h; value = mtp.placement.partsOn config h; }})
                (builtins.fromJSON {nixh.string(json.dumps(HOST_NAMES))}));
              dialHost = builtins.mapAttrs (name: _: mtp.placement.dialHost config name) config.workers;
              peers = builtins.mapAttrs (name: w: if w.distributed == null then null else mtp.distributed.peers config name) config.workers;
              # Each rank's environment, files as their text (for the workers whose files can be written).
              environments = builtins.mapAttrs (name: w:
                if w.distributed == null || mtp.distributed.peers config name == null
                   || (w.distributed.backend == "jaccl" && w.distributed.ibvDevices == null) then null
                else builtins.genList (rank: mtp.distributed.environment {{ inherit config name rank; writeText = _: text: text; }})
                  (builtins.length w.distributed.hosts)) config.workers;
            }};
        in map verdict (builtins.fromJSON (builtins.readFile {data}))
        """
    )
    assert len(results) == len(fleets_)
    mismatches_seen = 0
    context_caps_seen = 0
    depth_maps_seen = 0
    placement_codes_seen: set[str] = set()
    distributed_seen = 0
    flags_seen: set[str] = set()
    environments_seen: set[str] = set()
    tenant_rules_seen: set[str] = set()
    for fleet, nix in zip(fleets_, results):
        config, report = validate_data(fleet, "<fleet>")
        assert config is not None, (fleet, report.render_text())
        python_mismatched = sorted(f.path[1] for f in report.findings if f.code == "concurrency-mismatch")
        assert nix["mismatched"] == python_mismatched, fleet
        assert nix["mismatched"] == sorted(n for n, w in config.workers.items() if not is_coupled(config.proxy, w)), fleet
        assert nix["argv"] == {name: worker_argv(w) for name, w in config.workers.items()}, fleet
        assert nix["rendered"] == config.model_dump(by_alias=True, mode="json"), fleet
        for code, key in (("tenant-beyond-fleet", "tenantsBeyondFleet"), ("tenant-name", "tenantNames")):
            assert nix[key] == sorted(f.path[2] for f in report.findings if f.code == code), fleet
        tenant_rules_seen.update(k for k in ("tenantsBeyondFleet", "tenantNames") if nix[k])
        for name, w in config.workers.items():
            argv = worker_argv(w)
            resolved = ["/bin/" + argv[0], *argv[1:]]
            assert unquote_exec_start(nix["execStart"][f"mtpstack-worker-{name}"]) == resolved, fleet
            # launchd runs it behind nix-darwin's wait for the store: `sh -c '... exec "$@"' NAME ARGV...`.
            assert nix["programArguments"][f"mtpstack-worker-{name}"][4:] == resolved, fleet
        mismatches_seen += bool(python_mismatched)
        context_caps_seen += any("--max-context-tokens" in worker_argv(w) for w in config.workers.values())
        depth_maps_seen += any("--draft-depth-map" in worker_argv(w) for w in config.workers.values())
        flags_seen.update(a for w in config.workers.values() if w.backend == "native" for a in worker_argv(w)[2:])
        placement = sorted((f.code, list(f.path)) for f in report.findings if f.code in PLACEMENT_CODES and f.severity == "error")
        assert sorted((e["code"], e["path"]) for e in nix["placementErrors"]) == placement, fleet
        # Nix lists hosts by name, Python in the file's order: the same set.
        assert sorted(nix["placementWarnings"]) == sorted(list(f.path) for f in report.findings if f.code == "host-runs-nothing"), fleet
        for host in HOST_NAMES:
            proxy_runs, names = parts_on(config, host)
            assert nix["partsOn"][host] == {"proxy": proxy_runs, "workers": sorted(names)}, (fleet, host)
        assert nix["dialHost"] == {name: dial_host(config, name) for name in config.workers}, fleet
        assert nix["peers"] == {name: rank_peers(config, name) for name in config.workers}, fleet
        for name, w in config.workers.items():
            if nix["environments"][name] is not None:
                files = tmp_path / "rank-file.json"
                envs = rank_environments(rank_peers(config, name), w.distributed.backend, files, w.distributed.ibv_devices)
                # The files' contents, parsed (the two write JSON with other spacing).
                read = [{k: json.loads(files.read_text()) if v == str(files) else v for k, v in env.items()} for env in envs]
                files_of = {"MLX_HOSTFILE", "MLX_IBV_DEVICES"}
                rendered = [{k: json.loads(v) if k in files_of else v for k, v in env.items()} for env in nix["environments"][name]]
                assert rendered == read, fleet
                environments_seen.add(w.distributed.backend)
        distributed_seen += any(w.distributed is not None for w in config.workers.values())
        placement_codes_seen.update(code for code, _ in placement)
    # The draw exercises both verdicts, not only one.
    assert 0 < mismatches_seen < len(fleets_)
    assert 0 < context_caps_seen < len(fleets_)
    assert 0 < depth_maps_seen < len(fleets_)
    assert placement_codes_seen == PLACEMENT_CODES
    assert 0 < distributed_seen < len(fleets_)
    # Every flag a config can set was drawn, so each of them was compared.
    assert {s.flag for s in WORKER_SETTINGS if s.config} <= flags_seen
    assert environments_seen == {"ring", "jaccl"}
    assert tenant_rules_seen == {"tenantsBeyondFleet", "tenantNames"}
