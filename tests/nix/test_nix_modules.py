"""The NixOS and nix-darwin modules evaluated with nixpkgs' `lib` (NIXPKGS_LIB),
the platform options stubbed: option types, assertions, units, daemons."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.nix, pytest.mark.nixpkgs_lib]
VALID = sorted((ROOT / "examples" / "nix" / "valid").glob("*.nix"))
SINGLE = ROOT / "examples" / "nix" / "valid" / "single-mtp.nix"
MIXED = ROOT / "examples" / "nix" / "valid" / "mixed-fleet.nix"
GATE_MISMATCH = ROOT / "examples" / "nix" / "invalid" / "gate-mismatch.nix"
BUNDLED = ROOT / "examples" / "nix" / "valid" / "bundled-mtp.nix"

TARGET = "mlx-community/Qwen3.8-27B-4bit"
DRAFTER = "lukaskremla/Qwen3.8-27B-MTP-6bit-MLX"


def one_worker(**overrides: str) -> str:
    """A Nix module with one worker; `overrides` are Nix expressions by option name."""
    worker = {"target": '{ path = "t"; bits = 4; }', "maxNumSeqs": "1", "port": "8101", **overrides}
    body = " ".join(f"{k} = {v};" for k, v in worker.items())
    return f"{{ services.mtpstack = {{ enable = true; workers.w = {{ {body} }}; }}; }}"


@pytest.mark.parametrize("value", ["0", "5", '"3"'])
def test_max_num_seqs_outside_its_type_is_rejected_with_nixpkgs_text(nixh, nixpkgs_lib, value):
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "nixos", one_worker(maxNumSeqs=value))
    assert (
        "error: A definition for option `services.mtpstack.workers.w.maxNumSeqs' is not of type "
        "`integer between 1 and 4 (both inclusive)'. Definition values:"
    ) in e.value.stderr
    assert f": {value}" in e.value.stderr


@pytest.mark.parametrize(
    ("option", "value", "type_text"),
    [
        ("backend", '"vllm"', "one of \"native\", \"mlx-lm\""),
        ("port", "70000", "16 bit unsigned integer"),
        ("drafter", '{ path = "d"; bits = 6; depth = 9; }', "integer between 1 and 8 (both inclusive)"),
        ("drafter", '{ path = "d"; bits = 6; depth = 3; kind = "eagle"; }', 'one of "auto", "mtp", "model"'),
        ("drafter", '{ path = "d"; bits = 6; depth = { code = 9; default = 3; }; }', "drafter.depth.code' is not of type `integer between 1 and 8"),
        ("drafter", '{ path = "d"; bits = 6; depth = "3"; }', "drafter.depth' is not of type `integer between 1 and 8"),
        ("maxContextTokens", "0", "null or (positive integ"),
        ("maxContextTokens", '"4096"', "null or (positive integ"),
        ("prefixCache.maxGiB", "(-1)", "number between 0 and 65536"),
        ("prefixCache.maxGiB", '"2"', "number between 0 and 65536"),
    ],
)
def test_other_options_reject_values_outside_their_types(nixh, nixpkgs_lib, option, value, type_text):
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "nixos", one_worker(**{option: value}))
    assert "is not of type" in e.value.stderr and type_text in e.value.stderr


@pytest.mark.parametrize("platform", ["nixos", "darwin"])
def test_a_gate_and_width_that_disagree_fail_the_assertion_with_the_exact_message(nixh, nixpkgs_lib, platform):
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, platform, f"import {GATE_MISMATCH}")
    message = (
        "Failed assertions:\n"
        "       - these two must agree: `services.mtpstack.workers.qwen-mtp.maxNumSeqs` is 2 but "
        "`services.mtpstack.proxy.concurrencyLimit` is 1 (model `qwen3.8-27b` has no entry in "
        "`services.mtpstack.proxy.modelConcurrencyLimits`); the proxy admits that many requests at once to "
        "each worker of model `qwen3.8-27b`. Move them together, to the same value from 1 to 4; any matched "
        "pair is valid, with or without a drafter"
    )
    assert message in e.value.stderr


def test_moving_both_together_to_four_passes(nixh, nixpkgs_lib):
    settings = (
        f"{{ lib, ... }}: {{ imports = [ {GATE_MISMATCH} ]; services.mtpstack.proxy.concurrencyLimit = 4;"
        " services.mtpstack.workers.qwen-mtp.maxNumSeqs = lib.mkForce 4; }"
    )
    result = nixh.eval_module(nixpkgs_lib, "nixos", settings)
    assert result["renderedConfig"]["workers"]["qwen-mtp"]["maxNumSeqs"] == 4


def test_worker_exec_start_carries_the_weight_paths_and_depth(nixh, nixpkgs_lib):
    services = nixh.eval_module(nixpkgs_lib, "nixos", f"import {SINGLE}")["services"]
    argv = shlex.split(services["mtpstack-worker-qwen-mtp"]["serviceConfig"]["ExecStart"])
    assert argv[0].endswith("-mtpstack/bin/mtpstack")
    assert argv[1:] == [
        "worker", "--model", TARGET, "--target-bits", "4",
        "--draft-model", DRAFTER, "--drafter-bits", "6", "--draft-depth", "auto", "--draft-max-depth", "4",
        "--draft-kind", "auto", "--max-num-seqs", "2", "--prefix-cache-gib", "2",
        # On NixOS the disk tier is on by default, in the worker's state directory.
        "--prefix-cache-dir", "/var/lib/mtpstack/workers/qwen-mtp/prefix-cache", "--prefix-cache-disk-gib", "32",
        "--served-model-name", "qwen3.8-27b", "--host", "127.0.0.1", "--port", "8101",
    ]  # fmt: skip


def test_a_declared_drafter_kind_reaches_the_worker_and_the_rendered_config(nixh, nixpkgs_lib):
    result = nixh.eval_module(nixpkgs_lib, "nixos", f"import {BUNDLED}")
    argv = shlex.split(result["services"]["mtpstack-worker-qwen35-bundled"]["serviceConfig"]["ExecStart"])
    assert argv[argv.index("--draft-model") + 1] == argv[argv.index("--model") + 1]  # the bundled head
    assert argv[argv.index("--draft-depth") + 1 : argv.index("--draft-depth") + 6] == ["auto", "--draft-max-depth", "4", "--draft-kind", "mtp"]
    drafters = {n: w["drafter"]["kind"] for n, w in result["renderedConfig"]["workers"].items()}
    assert drafters == {"qwen35-bundled": "mtp", "qwen3-small-drafter": "model"}
    default = nixh.eval_module(nixpkgs_lib, "nixos", one_worker(drafter='{ path = "d"; bits = 6; depth = 3; }'))
    assert default["renderedConfig"]["workers"]["w"]["drafter"]["kind"] == "auto"


@pytest.mark.parametrize(("drafter", "argv_part", "rendered"), [
    ('{ path = "d"; bits = 6; depth = { prose = 2; code = 4; default = 3; }; }',
     ["--draft-depth", "3", "--draft-depth-map", "code=4,prose=2", "--draft-kind", "auto"],
     {"depth": {"code": 4, "default": 3, "prose": 2}}),
    # `auto` for one class: its bound follows the map.
    ('{ path = "d"; bits = 6; depth = { code = 4; default = "auto"; }; maxDepth = 6; }',
     ["--draft-depth", "auto", "--draft-depth-map", "code=4", "--draft-max-depth", "6"],
     {"depth": {"code": 4, "default": "auto"}, "maxDepth": 6}),
], ids=["classes", "auto"])
def test_a_depth_per_class_reaches_the_worker_as_one_plain_argument_and_the_rendered_config(nixh, nixpkgs_lib, drafter,
                                                                                              argv_part, rendered):
    result = nixh.eval_module(nixpkgs_lib, "nixos", one_worker(drafter=drafter))
    argv = shlex.split(result["services"]["mtpstack-worker-w"]["serviceConfig"]["ExecStart"])
    i = argv.index("--draft-depth")
    assert argv[i : i + 6] == argv_part
    got = result["renderedConfig"]["workers"]["w"]["drafter"]
    assert {k: got[k] for k in rendered} == rendered


@pytest.mark.parametrize(("drafter", "message"), [
    ('{ path = "d"; bits = 6; depth = "deep"; }', 'value "auto"'),
    ('{ path = "d"; bits = 6; depth = "auto"; maxDepth = 9; }', "between 1 and 8"),
])
def test_a_depth_word_other_than_auto_or_a_bound_out_of_range_fails_evaluation(nixh, nixpkgs_lib, drafter, message):
    with pytest.raises(nixh.NixError) as err:
        nixh.eval_module(nixpkgs_lib, "nixos", one_worker(drafter=drafter))
    assert message in str(err.value)


def test_max_context_tokens_reaches_the_worker_after_its_width_and_the_rendered_config(nixh, nixpkgs_lib):
    result = nixh.eval_module(nixpkgs_lib, "nixos", one_worker(maxContextTokens="32768"))
    argv = shlex.split(result["services"]["mtpstack-worker-w"]["serviceConfig"]["ExecStart"])
    i = argv.index("--max-num-seqs")
    assert argv[i : i + 4] == ["--max-num-seqs", "1", "--max-context-tokens", "32768"]
    assert result["renderedConfig"]["workers"]["w"]["maxContextTokens"] == 32768
    default = nixh.eval_module(nixpkgs_lib, "nixos", one_worker())
    assert "--max-context-tokens" not in default["services"]["mtpstack-worker-w"]["serviceConfig"]["ExecStart"]
    assert default["renderedConfig"]["workers"]["w"]["maxContextTokens"] is None


@pytest.mark.parametrize(("value", "flag"), [("0.5", "0.5"), ("0", "0"), ("16", "16")])
def test_the_prefix_cache_budget_reaches_the_worker_and_the_rendered_config(nixh, nixpkgs_lib, value, flag):
    result = nixh.eval_module(nixpkgs_lib, "nixos", one_worker(**{"prefixCache.maxGiB": value}))
    argv = shlex.split(result["services"]["mtpstack-worker-w"]["serviceConfig"]["ExecStart"])
    assert argv[argv.index("--prefix-cache-gib") + 1] == flag
    # Beside the modules' default disk tier, in the worker's state directory.
    assert result["renderedConfig"]["workers"]["w"]["prefixCache"] == {
        "maxGiB": float(value), "diskGiB": 32, "dir": "/var/lib/mtpstack/workers/w/prefix-cache"}


def test_units_are_hardened_with_a_state_directory_and_no_blas_preload(nixh, nixpkgs_lib):
    services = nixh.eval_module(nixpkgs_lib, "nixos", f"import {MIXED}")["services"]
    worker, proxy = services["mtpstack-worker-qwen-mtp"], services["mtpstack-proxy"]
    for unit in (worker, proxy):
        sc = unit["serviceConfig"]
        assert sc["DynamicUser"] and sc["NoNewPrivileges"] and sc["PrivateTmp"]
        assert (sc["ProtectSystem"], sc["CapabilityBoundingSet"]) == ("strict", [""])
        assert "@system-service" in sc["SystemCallFilter"]
        assert "mtpstack" in sc["StateDirectory"]
        assert unit["environment"]["HF_HOME"] == "/var/lib/mtpstack/huggingface"
    # nixpkgs' openblas is ILP64 on x86_64-linux: never preloaded into numpy's LP64 processes.
    assert "LD_PRELOAD" not in worker["environment"] and "LD_PRELOAD" not in proxy["environment"]
    assert proxy["serviceConfig"]["ExecStart"].split()[1:3] == ['"proxy"', '"--config"']
    workers = sorted(f"mtpstack-worker-{n}.service" for n in ("qwen-mlx-lm", "qwen-mtp", "small"))
    assert sorted(proxy["wants"]) == workers and set(workers) <= set(proxy["after"])


def test_api_keys_are_copied_for_the_proxy_at_start_and_on_reload(nixh, nixpkgs_lib):
    result = nixh.eval_module(nixpkgs_lib, "nixos", f"import {MIXED}")
    sc = result["services"]["mtpstack-proxy"]["serviceConfig"]
    # a privileged step (`+`) copies the operator's file where only the unit's dynamic user reads it
    copy = sc["ExecStartPre"]
    assert len(copy) == 1 and copy[0].startswith('+"/bin/sh" "/nix/store/')
    assert copy[0].endswith('"/run/secrets/mtpstack-api-keys" "/run/mtpstack-proxy"')
    assert sc["RuntimeDirectory"] == ["mtpstack-proxy"] and sc["RuntimeDirectoryMode"] == "0700"
    # `systemctl reload`: the copy again, then SIGHUP, on which the proxy re-reads keys and tenants
    assert sc["ExecReload"] == [copy[0], "/nix/store/" + sc["ExecReload"][1].split("/nix/store/", 1)[1]]
    assert sc["ExecReload"][1].endswith("-coreutils/bin/kill -HUP $MAINPID")
    assert "LoadCredential" not in sc
    assert nixh.eval(f"(import {nixh.lib}).systemd.apiKeysCredential") == "/run/mtpstack-proxy/api-keys"


def test_the_copy_script_replaces_the_keys_for_the_directorys_owner_readable_by_it_alone(nixh, tmp_path):
    script = tmp_path / "copy-keys.sh"
    script.write_text(nixh.eval(f'(import {nixh.lib}).systemd.copyKeysScript "{Path(shutil.which("install")).parent}"'))
    keys, run = tmp_path / "keys", tmp_path / "run"
    run.mkdir(mode=0o700)
    for text in ("alice sk-1\n", "bob sk-2\n"):  # at start, then on reload: the new file replaces the old
        keys.write_text(text)
        subprocess.run(["/bin/sh", str(script), str(keys), str(run)], check=True)
        copy = run / "api-keys"
        assert copy.read_text() == text and copy.stat().st_mode & 0o777 == 0o400
        assert (copy.stat().st_uid, copy.stat().st_gid) == (run.stat().st_uid, run.stat().st_gid)
    assert sorted(p.name for p in run.iterdir()) == ["api-keys"]


def test_tenants_render_with_their_defaults_and_a_tenant_beyond_the_fleet_is_refused(nixh, nixpkgs_lib):
    settings = f'''{{ lib, ... }}: {{ imports = [ {MIXED} ];
      services.mtpstack.proxy.tenants = {{ alice = {{ weight = 2; maxConcurrent = 3; }}; ci.requestsPerMinute = 30; }}; }}'''
    result = nixh.eval_module(nixpkgs_lib, "nixos", settings)
    tenants = result["renderedConfig"]["proxy"]["tenants"]
    assert tenants == {
        "alice": {"maxConcurrent": 3, "tokensPerMinute": None, "requestsPerMinute": None, "weight": 2},
        "ci": {"maxConcurrent": None, "tokensPerMinute": None, "requestsPerMinute": 30, "weight": 1},
    }
    assert result["renderedConfig"]["proxy"]["fairQueueing"] is True
    too_many = settings.replace("maxConcurrent = 3;", "maxConcurrent = 99;")
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "nixos", too_many)
    assert "tenant `alice` may have 99 requests in flight" in e.value.stderr
    assert "`services.mtpstack.proxy.tenants.alice.maxConcurrent`" in e.value.stderr


def test_an_api_keys_file_in_the_store_is_rejected(nixh, nixpkgs_lib):
    settings = '{ services.mtpstack = { enable = true; proxy.apiKeysFile = "/nix/store/00000000000000000000000000000000-keys"; }; }'
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "nixos", settings)
    assert "`services.mtpstack.proxy.apiKeysFile' is not of type" in e.value.stderr


def test_open_firewall_opens_only_the_proxy_port(nixh, nixpkgs_lib):
    assert nixh.eval_module(nixpkgs_lib, "nixos", f"import {MIXED}")["firewall"] == [8080]
    assert nixh.eval_module(nixpkgs_lib, "nixos", f"import {SINGLE}")["firewall"] == []


def test_darwin_program_arguments_carry_the_weight_paths(nixh, nixpkgs_lib):
    result = nixh.eval_module(nixpkgs_lib, "darwin", f"import {SINGLE}")
    sc = result["daemons"]["mtpstack-worker-qwen-mtp"]["serviceConfig"]
    wait, args = sc["ProgramArguments"][:4], sc["ProgramArguments"][4:]
    # As nix-darwin's own daemons: wait for the store's volume, then exec the argv unquoted.
    assert wait == ["/bin/sh", "-c", '/bin/wait4path /nix/store && exec "$@"', "mtpstack-worker-qwen-mtp"]
    assert args[0].endswith("-mtpstack/bin/mtpstack")
    assert args[args.index("--model") + 1] == TARGET
    assert args[args.index("--draft-model") + 1] == DRAFTER
    assert args[args.index("--draft-depth") + 1] == "auto"
    assert (sc["KeepAlive"], sc["RunAtLoad"], sc["Label"]) == (True, True, "org.nixos.mtpstack-worker-qwen-mtp")
    assert sc["StandardErrorPath"].startswith("/var/log/mtpstack/")
    proxy = result["daemons"]["mtpstack-proxy"]["serviceConfig"]["ProgramArguments"]
    assert proxy[2].startswith("/bin/wait4path /nix/store") and proxy[5:7] == ["proxy", "--config"]
    assert result["knownUsers"] == [sc["UserName"]]


@pytest.mark.parametrize("platform", ["nixos", "darwin"])
def test_the_module_renders_what_the_pure_function_renders(nixh, nixpkgs_lib, platform):
    for example in VALID:
        rendered = nixh.eval_module(nixpkgs_lib, platform, f"import {example}")["renderedConfig"]
        pure = nixh.eval(f"(import {nixh.lib}).render (import {example}).services.mtpstack")
        # But for the disk tier, which the modules keep in each native worker's state directory.
        for name, w in pure["workers"].items():
            if w["backend"] == "native" and w["prefixCache"]["dir"] is None:
                w["prefixCache"]["dir"] = f"/var/lib/mtpstack/workers/{name}/prefix-cache"
        assert rendered == pure, example.name


def test_the_modules_rendered_config_validates(nixh, nixpkgs_lib, tmp_path):
    for example in VALID:
        rendered = nixh.eval_module(nixpkgs_lib, "nixos", f"import {example}")["renderedConfig"]
        file = tmp_path / f"{example.stem}.json"
        file.write_text(json.dumps(rendered))
        proc = subprocess.run([sys.executable, "-m", "mtpstack", "validate", str(file)], capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_darwin_makes_the_directories_before_launchd_loads_the_daemons_by_numeric_id(nixh, nixpkgs_lib):
    """nix-darwin's activation runs extraActivation, then `users` (the account is made), then
    `launchd`, then postActivation: the directories come first, owned by the ids the account gets."""
    activation = nixh.eval_module(nixpkgs_lib, "darwin", f"import {SINGLE}")["activation"]
    assert activation["postActivation"] == ""
    lines = activation["extraActivation"].splitlines()
    assert lines[0] == "mkdir -p /var/lib/mtpstack/huggingface/hub /var/log/mtpstack"
    assert lines[1].startswith("chown 470:470 /var/lib/mtpstack ") and lines[1].endswith(" /var/log/mtpstack")
    moved = nixh.eval_module(
        nixpkgs_lib, "darwin", f"{{ imports = [ {SINGLE} ]; users.users._mtpstack.uid = 610; users.groups._mtpstack.gid = 620; }}"
    )
    assert moved["activation"]["extraActivation"].splitlines()[1].startswith("chown 610:620 ")


#: The uids and gids nix-darwin's own modules give their accounts (at nix-darwin a1fa429e):
#: modules/misc/ids.nix (nixbld 350 and the build users after it, 534, 535),
#: services/hercules-ci-agent (399, gid 32001), examples/hydra.nix (530), services/ofborg (531),
#: services/gitlab-runner.nix (532), services/github-runner/service.nix (533).
NIX_DARWIN_IDS = {*range(350, 350 + 64), 399, 530, 531, 532, 533, 534, 535, 32001}


def test_the_darwin_account_takes_an_id_nix_darwin_gives_no_other_account(nixh, nixpkgs_lib):
    activation = nixh.eval_module(nixpkgs_lib, "darwin", f"import {SINGLE}")["activation"]
    uid, gid = activation["extraActivation"].splitlines()[1].split()[1].split(":")
    assert int(uid) not in NIX_DARWIN_IDS and int(gid) not in NIX_DARWIN_IDS
    assert int(uid) < 501  # below the accounts macOS gives people


def test_the_routing_reaches_the_rendered_config_and_only_its_two_policies_pass(nixh, nixpkgs_lib):
    settings = '{ services.mtpstack = { enable = true; proxy.routing = "first-free"; }; }'
    assert nixh.eval_module(nixpkgs_lib, "nixos", settings)["renderedConfig"]["proxy"]["routing"] == "first-free"
    assert nixh.eval_module(nixpkgs_lib, "nixos", "{ services.mtpstack.enable = true; }")["renderedConfig"]["proxy"]["routing"] == "affinity"
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "nixos", '{ services.mtpstack = { enable = true; proxy.routing = "round-robin"; }; }')
    assert "`services.mtpstack.proxy.routing' is not of type" in e.value.stderr and 'one of "affinity", "first-free"' in e.value.stderr


def test_the_affinity_wait_reaches_the_rendered_config_and_a_negative_one_is_refused(nixh, nixpkgs_lib):
    settings = '{ services.mtpstack = { enable = true; proxy.affinityWaitSeconds = 2.5; }; }'
    assert nixh.eval_module(nixpkgs_lib, "nixos", settings)["renderedConfig"]["proxy"]["affinityWaitSeconds"] == 2.5
    assert nixh.eval_module(nixpkgs_lib, "nixos", "{ services.mtpstack.enable = true; }")["renderedConfig"]["proxy"]["affinityWaitSeconds"] == 0
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "nixos", "{ services.mtpstack = { enable = true; proxy.affinityWaitSeconds = -1; }; }")
    assert "`services.mtpstack.proxy.affinityWaitSeconds' is not of type" in e.value.stderr


def test_the_disk_tier_is_on_by_default_in_a_state_directory_of_the_workers_unit(nixh, nixpkgs_lib):
    unit = nixh.eval_module(nixpkgs_lib, "nixos", one_worker())["services"]["mtpstack-worker-w"]["serviceConfig"]
    argv = shlex.split(unit["ExecStart"])
    assert argv[argv.index("--prefix-cache-dir") + 1] == "/var/lib/mtpstack/workers/w/prefix-cache"
    assert argv[argv.index("--prefix-cache-disk-gib") + 1] == "32"
    # systemd makes it, owned by the unit's dynamic user, and keeps it across restarts.
    assert unit["StateDirectory"][-1] == "mtpstack/workers/w/prefix-cache" and "ReadWritePaths" not in unit
    elsewhere = nixh.eval_module(nixpkgs_lib, "nixos", one_worker(**{"prefixCache.dir": '"/srv/cache"'}))
    unit = elsewhere["services"]["mtpstack-worker-w"]["serviceConfig"]
    assert unit["ReadWritePaths"] == ["-/srv/cache"] and unit["StateDirectory"][-1] == "mtpstack/huggingface/hub"
    assert elsewhere["renderedConfig"]["workers"]["w"]["prefixCache"]["dir"] == "/srv/cache"
    off = nixh.eval_module(nixpkgs_lib, "nixos", one_worker(**{"prefixCache.dir": "null"}))["services"]["mtpstack-worker-w"]
    assert "--prefix-cache-dir" not in off["serviceConfig"]["ExecStart"] and "--prefix-cache-disk-gib" not in off["serviceConfig"]["ExecStart"]


@pytest.mark.parametrize("value", ['"relative/dir"', "(-1)"])
def test_a_disk_tier_outside_its_types_is_rejected(nixh, nixpkgs_lib, value):
    option = "prefixCache.diskGiB" if value == "(-1)" else "prefixCache.dir"
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "nixos", one_worker(**{option: value}))
    assert f"services.mtpstack.workers.w.{option}' is not of type" in e.value.stderr


def test_darwin_makes_each_local_workers_disk_tier_for_the_daemons_user(nixh, nixpkgs_lib):
    result = nixh.eval_module(nixpkgs_lib, "darwin", f"import {SINGLE}")
    lines = result["activation"]["extraActivation"].splitlines()
    dir_ = "/var/lib/mtpstack/workers/qwen-mtp/prefix-cache"
    assert lines[3:6] == [f"mkdir -p {dir_}", f"chown 470:470 {dir_}", f"chmod 0750 {dir_}"]
    args = result["daemons"]["mtpstack-worker-qwen-mtp"]["serviceConfig"]["ProgramArguments"]
    assert args[args.index("--prefix-cache-dir") + 1] == dir_


def test_launchd_gives_the_proxy_its_grace_before_sigkill_as_systemd_does(nixh, nixpkgs_lib):
    # launchd sends SIGKILL 20 s after SIGTERM unless ExitTimeOut says otherwise (nix-darwin
    # modules/launchd/launchd.nix); the proxy's in-flight requests get shutdownGraceSeconds (30).
    darwin = nixh.eval_module(nixpkgs_lib, "darwin", f"import {MIXED}")["daemons"]
    nixos = nixh.eval_module(nixpkgs_lib, "nixos", f"import {MIXED}")["services"]
    exit_timeout = darwin["mtpstack-proxy"]["serviceConfig"]["ExitTimeOut"]
    assert exit_timeout == nixos["mtpstack-proxy"]["serviceConfig"]["TimeoutStopSec"] == 40
    longer = "{ lib, ... }: { imports = [ %s ]; services.mtpstack.proxy.shutdownGraceSeconds = 120.5; }" % MIXED
    assert nixh.eval_module(nixpkgs_lib, "darwin", longer)["daemons"]["mtpstack-proxy"]["serviceConfig"]["ExitTimeOut"] == 131


def test_every_daemon_runs_as_interactive_so_launchd_does_not_throttle_it(nixh, nixpkgs_lib):
    # Without ProcessType launchd applies "light resource limits, throttling CPU usage and I/O".
    daemons = nixh.eval_module(nixpkgs_lib, "darwin", f"import {MIXED}")["daemons"]
    assert {name: d["serviceConfig"]["ProcessType"] for name, d in daemons.items()} == dict.fromkeys(daemons, "Interactive")


def test_moving_the_darwin_group_moves_the_accounts_primary_group(nixh, nixpkgs_lib):
    # As nix-darwin's own services: users.users.<name>.gid = mkDefault config.users.groups.<name>.gid.
    result = nixh.eval_module(nixpkgs_lib, "darwin", f"{{ imports = [ {SINGLE} ]; users.groups._mtpstack.gid = 620; }}")
    assert result["accounts"]["users"]["_mtpstack"] == {"uid": 470, "gid": 620}
    assert result["accounts"]["groups"]["_mtpstack"] == {"gid": 620}
    assert result["activation"]["extraActivation"].splitlines()[1].startswith("chown 470:620 ")
    default = nixh.eval_module(nixpkgs_lib, "darwin", f"import {SINGLE}")["accounts"]
    assert default["users"]["_mtpstack"]["gid"] == default["groups"]["_mtpstack"]["gid"] == 470
