"""What a `nixos-rebuild switch` / `darwin-rebuild switch` restarts after an edit of one worker: two
fleets that differ in one setting, each evaluated with the NixOS and the nix-darwin module
(NIXPKGS_LIB, platform options stubbed, `pkgs.writeText`/`runCommand` giving paths that follow
their contents as real derivations do). NixOS restarts a unit whose unit text (ExecStart,
environment, X-Restart-Triggers...) changed; nix-darwin reloads a daemon whose plist text changed
(modules/system/launchd.nix `diff`s them). An edit of a worker's tuning restarts that worker only;
the proxy restarts when something it acts on changes (modules/lib/proxy.nix's `view`), and the
Python proxy is held to that list here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpstack.proxy.app import create_app
from mtpstack.proxy.fleet import weights_check
from mtpstack.proxy.state import STATE
from mtpstack.validator import FleetConfig, worker_argv

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.nix, pytest.mark.nixpkgs_lib]
MIXED = ROOT / "examples" / "nix" / "valid" / "mixed-fleet.nix"
HOSTS_NIX = ROOT / "examples" / "fleet" / "hosts.nix"
W = "services.mtpstack.workers"

#: Edits of worker `qwen-mtp` of examples/nix/valid/mixed-fleet.nix the proxy does not act on.
TUNING = {
    "depth": f"{W}.qwen-mtp.drafter.depth = lib.mkForce 5;",
    "depth per class": f"{W}.qwen-mtp.drafter.depth = lib.mkForce {{ code = 4; default = 2; }};",
    "drafter bits": f"{W}.qwen-mtp.drafter.bits = lib.mkForce 8;",
    "target bits": f"{W}.qwen-mtp.target.bits = lib.mkForce 8;",
    "context cap": f"{W}.qwen-mtp.maxContextTokens = 32768;",
    "prefix cache": f"{W}.qwen-mtp.prefixCache.maxGiB = 8;",
    "prefix cache on disk": f"{W}.qwen-mtp.prefixCache.diskGiB = 64;",
    "extra arguments": f'{W}.qwen-mtp.extraArgs = [ "--log-level" "debug" ];',
}
#: Edits of the same worker the proxy acts on: it dials, gates, routes or checks them.
VIEW = {
    "port": f"{W}.qwen-mtp.port = lib.mkForce 8112;",
    "width and gate": f'{W}.qwen-mtp.maxNumSeqs = lib.mkForce 2; services.mtpstack.proxy.modelConcurrencyLimits."qwen3.8-27b" = lib.mkForce 2;',
    "model": f'{W}.qwen-mtp.model = lib.mkForce "qwen3.8-27b-b"; services.mtpstack.proxy.modelConcurrencyLimits."qwen3.8-27b-b" = 3;',
    "target": f'{W}.qwen-mtp.target.path = lib.mkForce "/srv/models/other";',
    "drafter": f'{W}.qwen-mtp.drafter.path = lib.mkForce "/srv/models/other-head";',
    "drafter kind": f'{W}.qwen-mtp.drafter.kind = "mtp";',
    "listen address": f'{W}.qwen-mtp.host = "0.0.0.0";',
}


def evaluate(nixh, nixpkgs_lib, platform: str, edit: str = "", base: Path = MIXED) -> dict:
    return nixh.eval_module(nixpkgs_lib, platform, f"{{ lib, ... }}: {{ imports = [ {base} ]; {edit} }}")


def units(result: dict, platform: str) -> dict:
    """Unit name -> what decides a restart: NixOS' unit definition, nix-darwin's plist text."""
    return result["services"] if platform == "nixos" else result["plists"]


def changed(before: dict, after: dict) -> list[str]:
    return sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))


@pytest.fixture(scope="module", params=["nixos", "darwin"])
def platform(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def base(nixh, nixpkgs_lib, platform) -> dict:
    return evaluate(nixh, nixpkgs_lib, platform)


@pytest.mark.parametrize("what", TUNING)
def test_editing_one_workers_tuning_restarts_that_worker_only(nixh, nixpkgs_lib, platform, base, what):
    edited = evaluate(nixh, nixpkgs_lib, platform, TUNING[what])
    assert changed(units(base, platform), units(edited, platform)) == ["mtpstack-worker-qwen-mtp"]
    # The fleet file the proxy would read at its next start holds the edit all the same.
    assert edited["etc"]["mtpstack/fleet.json"] != base["etc"]["mtpstack/fleet.json"]


@pytest.mark.parametrize("what", VIEW)
def test_an_edit_the_proxy_acts_on_restarts_the_proxy_and_that_worker(nixh, nixpkgs_lib, platform, base, what):
    edited = evaluate(nixh, nixpkgs_lib, platform, VIEW[what])
    assert changed(units(base, platform), units(edited, platform)) == ["mtpstack-proxy", "mtpstack-worker-qwen-mtp"]


def test_the_proxy_reads_the_fleet_at_a_path_that_outlives_generations(nixh, nixpkgs_lib, platform, base):
    config = "/etc/mtpstack/fleet.json"
    if platform == "nixos":
        assert base["services"]["mtpstack-proxy"]["serviceConfig"]["ExecStart"].endswith(f'"proxy" "--config" "{config}"')
    else:
        assert base["daemons"]["mtpstack-proxy"]["serviceConfig"]["ProgramArguments"][-2:] == ["--config", config]
    # The file there is the checked one (modules/config-file.nix with checkConfig on).
    assert base["etc"]["mtpstack/fleet.json"].endswith("-mtpstack-checked.json")


def on_host(host: str, edit: str = "") -> str:
    return f"{{ lib, ... }}: {{ imports = (import {HOSTS_NIX}).{host}.modules; {edit} }}"


#: examples/fleet: the gateway runs the proxy (NixOS), mac1 and mac2 a worker each (nix-darwin).
HOSTS = {"gateway": "nixos", "mac1": "darwin", "mac2": "darwin"}


@pytest.mark.parametrize(
    ("edit", "restarted"),
    [
        (f"{W}.qwen-a.drafter.depth = lib.mkForce 4;", {"mac1": ["mtpstack-worker-qwen-a"]}),
        (f"{W}.qwen-a.port = lib.mkForce 8111;", {"mac1": ["mtpstack-worker-qwen-a"], "gateway": ["mtpstack-proxy"]}),
    ],
)  # fmt: skip
def test_across_hosts_a_workers_depth_restarts_it_on_its_mac_and_nothing_on_the_gateway(nixh, nixpkgs_lib, edit, restarted):
    for host, platform in HOSTS.items():
        before = nixh.eval_module(nixpkgs_lib, platform, on_host(host))
        after = nixh.eval_module(nixpkgs_lib, platform, on_host(host, edit))
        assert changed(units(before, platform), units(after, platform)) == restarted.get(host, []), host


# -- the proxy is held to its view ---------------------------------------------------------
def render(nixh, edit: str) -> dict:
    """The rendered config of mixed-fleet.nix after `edit`, as the modules render it (NixOS)."""
    return nixh.eval(f"(import {nixh.lib}).render ((import {MIXED}).services.mtpstack // {edit})")


def proxy_reads(config: FleetConfig) -> dict:
    """What the Python proxy built from `config` acts on: each upstream as it dials, gates, routes and
    rewrites it, the proxy's own settings, and the backend per worker."""
    # The example's API keys file is not on this machine; the proxy reads it at start only.
    state = create_app(config.model_copy(update={"proxy": config.proxy.model_copy(update={"api_keys_file": None})}))[STATE]
    return {
        "upstreams": {n: (u.model, u.url, u.gate, u.rewrite_model, u.order) for n, u in state.upstreams.items()},
        "admissions": {m: [u.name for u in a.upstreams] for m, a in state.admissions.items()},
        "proxy": config.proxy.model_dump(),
        "backends": {n: w.backend for n, w in config.workers.items()},
    }


def identity_of(profile) -> dict:
    """The `/identity` of a native worker started as `profile` says (what its argv and weights give)."""
    d = profile.drafter
    return {
        "target": {"path": profile.target.path},
        "drafter": None if d is None else {"path": d.path, "kind": "mtp" if d.kind == "auto" else d.kind},
        "draft_depth": None if d is None else d.default_depth,
        "draft_depth_map": {} if d is None else d.class_depths,
        "max_num_seqs": profile.max_num_seqs,
        "argv": ["/usr/bin/python3", "-m", *worker_argv(profile)],
    }


#: The same edits as above, on the rendered config: worker `qwen-mtp`'s profile updated with them.
RENDERED_TUNING = {
    "depth": {"drafter": {"path": "/srv/models/Qwen3.8-27B-MTP-6bit", "bits": 6, "depth": 5, "kind": "auto"}},
    "depth per class": {"drafter": {"path": "/srv/models/Qwen3.8-27B-MTP-6bit", "bits": 6, "depth": {"code": 4, "default": 2}, "kind": "auto"}},
    "drafter bits": {"drafter": {"path": "/srv/models/Qwen3.8-27B-MTP-6bit", "bits": 8, "depth": 2, "kind": "auto"}},
    "context cap": {"maxContextTokens": 32768},
    "prefix cache": {"prefixCache": {"maxGiB": 8}},
    "extra arguments": {"extraArgs": ["--log-level", "debug"]},
}  # fmt: skip


@pytest.mark.parametrize("what", RENDERED_TUNING)
def test_a_proxy_started_before_a_tuning_edit_acts_as_one_started_after_it(nixh, what):
    edit = json.dumps(RENDERED_TUNING[what])
    before = render(nixh, "{ }")
    after = render(nixh, f"{{ workers = (import {MIXED}).services.mtpstack.workers // {{ qwen-mtp = (import {MIXED}).services.mtpstack.workers.qwen-mtp // builtins.fromJSON {nixh.string(edit)}; }}; }}")
    assert before != after
    # Nix's view of what the proxy acts on is unchanged, so its unit is (the tests above) ...
    views = [nixh.eval(f"(import {nixh.lib}).proxy.view (builtins.fromJSON {nixh.string(json.dumps(c))})") for c in (before, after)]
    assert views[0] == views[1]
    # ... and the Python proxy indeed acts alike: same upstreams, gates, routes and settings, and the
    # worker restarted with the edit shows the old proxy no disagreement.
    old, new = FleetConfig.model_validate(before), FleetConfig.model_validate(after)
    assert proxy_reads(old) == proxy_reads(new)
    assert weights_check(old.workers["qwen-mtp"], identity_of(new.workers["qwen-mtp"])) == []


def test_an_edit_in_the_proxys_view_changes_what_the_python_proxy_acts_on(nixh):
    mtp = f"(import {MIXED}).services.mtpstack.workers.qwen-mtp"
    # (The listen address is in the view as the address the proxy dials; from `127.0.0.1` to `0.0.0.0`
    # it still dials loopback, a restart more than needed rather than one too few.)
    edits = {
        "port": "{ port = 8112; }",
        "target": '{ target = { path = "/srv/models/other"; bits = 4; }; }',
        "drafter": '{ drafter = { path = "/srv/models/other-head"; bits = 6; depth = 2; }; }',
    }
    before = render(nixh, "{ }")
    old = FleetConfig.model_validate(before)
    for what, edit in edits.items():
        after = render(nixh, f"{{ workers = (import {MIXED}).services.mtpstack.workers // {{ qwen-mtp = {mtp} // {edit}; }}; }}")
        views = [nixh.eval(f"(import {nixh.lib}).proxy.view (builtins.fromJSON {nixh.string(json.dumps(c))})") for c in (before, after)]
        assert views[0] != views[1], what
        new = FleetConfig.model_validate(after)
        assert proxy_reads(old) != proxy_reads(new) or weights_check(old.workers["qwen-mtp"], identity_of(new.workers["qwen-mtp"])), what


def test_editing_the_tenants_reloads_the_proxy_and_restarts_nothing(nixh, nixpkgs_lib, platform, base):
    edited = evaluate(nixh, nixpkgs_lib, platform, "services.mtpstack.proxy.tenants.alice = { weight = 2; maxConcurrent = 1; };")
    assert edited["etc"]["mtpstack/fleet.json"] != base["etc"]["mtpstack/fleet.json"]
    if platform == "darwin":
        # launchd has no reload: the daemon keeps running; `launchctl kill HUP` takes the edit (docs/nix.md)
        assert changed(units(base, platform), units(edited, platform)) == []
        return
    assert changed(units(base, platform), units(edited, platform)) == ["mtpstack-proxy"]
    before, after = base["services"]["mtpstack-proxy"], edited["services"]["mtpstack-proxy"]
    # only X-Reload-Triggers differ: switch-to-configuration reloads the unit (ExecReload: SIGHUP)
    assert before["reloadTriggers"] != after["reloadTriggers"]
    assert {**before, "reloadTriggers": None} == {**after, "reloadTriggers": None}
    assert before["serviceConfig"]["ExecReload"][-1].endswith("/bin/kill -HUP $MAINPID")
