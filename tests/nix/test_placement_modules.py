"""A fleet placed on three hosts (examples/fleet: the hosts' modules from hosts.nix, as the
example's flake deploys them), each host's module evaluated with nixpkgs' `lib` (NIXPKGS_LIB):
each gets exactly its own units, its firewall rule and the same rendered fleet; a fleet-wide
mistake fails on every host with the same message."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.nix, pytest.mark.nixpkgs_lib]
FLEET = ROOT / "examples" / "fleet" / "fleet.nix"
HOSTS_NIX = ROOT / "examples" / "fleet" / "hosts.nix"
#: host -> the platform its example configuration runs (examples/fleet/hosts.nix).
HOSTS = {"gateway": "nixos", "mac1": "darwin", "mac2": "darwin"}


def on_host(host: str, *extra: str, modules: tuple[str, ...] = ()) -> str:
    """Host `host`'s modules from the example, plus `extra` definitions and `modules`."""
    imports = f"(import {HOSTS_NIX}).{host}.modules ++ [ {' '.join(f'({m})' for m in modules)} ]"
    return f"{{ lib, ... }}: {{ imports = {imports}; {' '.join(extra)} }}"


def test_the_examples_hosts_are_the_ones_tested(nixh):
    hosts = nixh.eval(f"builtins.mapAttrs (_: h: h.platform) (import {HOSTS_NIX})")
    assert hosts == HOSTS


def units(result: dict, platform: str) -> list[str]:
    return sorted(result["services" if platform == "nixos" else "daemons"])


def test_each_host_runs_exactly_its_own_parts_and_renders_the_same_fleet(nixh, nixpkgs_lib):
    results = {host: nixh.eval_module(nixpkgs_lib, platform, on_host(host)) for host, platform in HOSTS.items()}
    assert {host: units(r, HOSTS[host]) for host, r in results.items()} == {
        "gateway": ["mtpstack-proxy"],
        "mac1": ["mtpstack-worker-qwen-a"],
        "mac2": ["mtpstack-worker-qwen-b"],
    }
    rendered = [r["renderedConfig"] for r in results.values()]
    assert rendered[0] == rendered[1] == rendered[2]
    assert set(rendered[0]["workers"]) == {"qwen-a", "qwen-b"}  # the whole fleet, on every host
    # The proxy waits for no worker unit: both run elsewhere and are dialled over the network.
    assert results["gateway"]["services"]["mtpstack-proxy"]["wants"] == []
    assert all(r["warnings"] == [] for r in results.values())


def test_the_darwin_host_name_falls_back_to_the_local_host_name(nixh, nixpkgs_lib):
    settings = f'{{ imports = [ {FLEET} ]; networking.localHostName = "mac2"; }}'
    result = nixh.eval_module(nixpkgs_lib, "darwin", settings)
    assert units(result, "darwin") == ["mtpstack-worker-qwen-b"]


def test_the_gateway_opens_the_proxy_port_and_no_worker_port(nixh, nixpkgs_lib):
    result = nixh.eval_module(nixpkgs_lib, "nixos", on_host("gateway"))
    assert result["firewall"] == [8080]
    assert result["firewallRules"] == {"nftables": "", "iptables": ""}


IPTABLES_RULE = "iptables -w -A nixos-fw -p tcp -s 10.0.0.1 --dport 8101 -j nixos-fw-accept\n"
NFTABLES_RULE = "ip saddr 10.0.0.1 tcp dport 8101 accept\n"
#: nixpkgs' `networking.firewall.backend` (nixos/modules/services/networking/firewall.nix), declared
#: as it declares it, for the evaluations that have it.
BACKEND_OPTION = (
    "options.networking.firewall.backend = lib.mkOption {"
    ' type = lib.types.enum [ "iptables" "nftables" "firewalld" ]; default = "iptables"; };'
)


@pytest.mark.parametrize(
    ("nftables", "rules"),
    [
        ("false", {"nftables": "", "iptables": IPTABLES_RULE}),
        ("true", {"nftables": NFTABLES_RULE, "iptables": ""}),
    ],
)
def test_a_worker_host_opens_the_worker_port_to_the_proxy_host_only(nixh, nixpkgs_lib, nftables, rules):
    # mac1's part on a Linux worker box, on a NixOS without `networking.firewall.backend`:
    # the backend follows `networking.nftables.enable`.
    result = nixh.eval_module(nixpkgs_lib, "nixos", on_host("mac1", f"networking.nftables.enable = {nftables};"))
    assert result["firewall"] == []  # never to everyone
    assert result["firewallRules"] == rules


@pytest.mark.parametrize(
    ("backend", "rules"),
    [
        ("iptables", {"nftables": "", "iptables": IPTABLES_RULE}),
        ("nftables", {"nftables": NFTABLES_RULE, "iptables": ""}),
        ("firewalld", {"nftables": "", "iptables": ""}),
    ],
)
def test_the_rules_follow_nixpkgs_firewall_backend_where_it_exists(nixh, nixpkgs_lib, backend, rules):
    # `networking.nftables.enable` says the opposite, to show the backend option wins.
    nftables = "false" if backend == "nftables" else "true"
    module = f'{{ lib, ... }}: {{ {BACKEND_OPTION} config.networking.firewall.backend = "{backend}"; config.networking.nftables.enable = {nftables}; }}'
    result = nixh.eval_module(nixpkgs_lib, "nixos", on_host("mac1", modules=(module,)))
    assert result["firewallRules"] == rules
    warned = [w for w in result["warnings"] if "under firewalld" in w]
    assert bool(warned) == (backend == "firewalld")
    if warned:
        assert "worker `qwen-a`'s port 8101" in warned[0] and "stay closed" in warned[0]


def test_an_ipv6_fleet_gets_ipv6_rules(nixh, nixpkgs_lib):
    extra = (
        'services.mtpstack.hosts.gateway.address = lib.mkForce "fd00::1";'
        ' services.mtpstack.hosts.mac1.address = lib.mkForce "fd00::11";'
    )
    for nftables, key, rule in (
        ("true", "nftables", "ip6 saddr fd00::1 tcp dport 8101 accept\n"),
        ("false", "iptables", "ip6tables -w -A nixos-fw -p tcp -s fd00::1 --dport 8101 -j nixos-fw-accept\n"),
    ):
        result = nixh.eval_module(nixpkgs_lib, "nixos", on_host("mac1", extra, f"networking.nftables.enable = {nftables};"))
        assert result["firewallRules"][key] == rule


def test_the_rule_family_is_the_dialled_addresss_and_a_mismatched_proxy_address_is_refused(nixh, nixpkgs_lib):
    # An IPv6 gateway dialling mac1 at 10.0.0.11 connects from an IPv4 address: `ip6 saddr fd00::1` would never match.
    extra = 'services.mtpstack.hosts.gateway.address = lib.mkForce "fd00::1";'
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "nixos", on_host("mac1", extra))
    assert (
        "would admit `services.mtpstack.hosts.gateway.address` `fd00::1` (IPv6) to worker `qwen-a`'s port,"
        " but the proxy dials that worker at `10.0.0.11` (IPv4)"
    ) in e.value.stderr


def test_a_worker_dialled_by_name_takes_the_proxy_addresss_family(nixh, nixpkgs_lib):
    extra = 'services.mtpstack.hosts.mac1.address = lib.mkForce "mac1.lan";'
    result = nixh.eval_module(nixpkgs_lib, "nixos", on_host("mac1", extra, "networking.nftables.enable = true;"))
    assert result["firewallRules"]["nftables"] == NFTABLES_RULE


def test_an_unplaced_proxy_with_the_firewall_open_fails_with_the_placement_message(nixh, nixpkgs_lib):
    # Before: "value is null while a string was expected" from the firewall's rule text.
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "nixos", on_host("mac1", "services.mtpstack.proxy.deployOn = lib.mkForce null;"))
    assert "`services.mtpstack.proxy.deployOn` is null, so every host would run a proxy" in e.value.stderr
    assert "value is null" not in e.value.stderr


def test_a_proxy_address_that_is_no_ip_fails_when_the_firewall_is_opened(nixh, nixpkgs_lib):
    extra = 'services.mtpstack.hosts.gateway.address = lib.mkForce "gateway.lan";'
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "nixos", on_host("mac1", extra))
    assert "`services.mtpstack.hosts.gateway.address` is `gateway.lan`, not an IP address" in e.value.stderr


def test_a_mismatched_gate_fails_on_every_host_with_the_same_message(nixh, nixpkgs_lib):
    extra = 'services.mtpstack.proxy.modelConcurrencyLimits."qwen3.8-27b" = lib.mkForce 3;'
    messages = set()
    for host, platform in HOSTS.items():
        with pytest.raises(nixh.NixError) as e:
            nixh.eval_module(nixpkgs_lib, platform, on_host(host, extra))
        failed = e.value.stderr[e.value.stderr.index("Failed assertions:") :]
        messages.add(failed)
        # Both workers are named, also on the hosts that do not run them.
        assert "workers.qwen-a.maxNumSeqs` is 2" in failed and "workers.qwen-b.maxNumSeqs` is 2" in failed
    assert len(messages) == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('services.mtpstack.workers.qwen-b.deployOn = lib.mkForce "mac3";',
         "`services.mtpstack.workers.qwen-b.deployOn` is `mac3`, which is not declared in `services.mtpstack.hosts`"),
        ("services.mtpstack.proxy.deployOn = lib.mkForce null;",
         "two proxies each fill the same worker's gate"),
        ('services.mtpstack.workers.qwen-a.host = lib.mkForce "127.0.0.1";',
         "`services.mtpstack.workers.qwen-a.host` is `127.0.0.1`: the worker runs on host `mac1` and listens on loopback only"),
    ],
)  # fmt: skip
def test_placement_errors_fail_every_hosts_evaluation(nixh, nixpkgs_lib, extra, message):
    for host, platform in HOSTS.items():
        with pytest.raises(nixh.NixError) as e:
            nixh.eval_module(nixpkgs_lib, platform, on_host(host, extra))
        assert message in e.value.stderr, host


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_mac_worker_listening_on_every_address_is_a_warning_naming_its_own_address(nixh, nixpkgs_lib, host):
    # nix-darwin has no port firewall: a worker on 0.0.0.0 is open to the whole network.
    result = nixh.eval_module(nixpkgs_lib, "darwin", on_host("mac1", f'services.mtpstack.workers.qwen-a.host = lib.mkForce "{host}";'))
    (warning,) = result["warnings"]
    assert warning.startswith(f"worker `qwen-a` listens on `{host}` (`services.mtpstack.workers.qwen-a.host`), every address of this Mac")
    assert "Set it to `10.0.0.11` (`services.mtpstack.hosts.mac1.address`)" in warning
    # Only the host that runs it is warned; the example binds each worker to its Mac's address.
    other = nixh.eval_module(nixpkgs_lib, "darwin", on_host("mac2", f'services.mtpstack.workers.qwen-a.host = lib.mkForce "{host}";'))
    assert other["warnings"] == []


def test_a_host_name_outside_the_declared_hosts_is_refused(nixh, nixpkgs_lib):
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "nixos", on_host("gateway", 'networking.hostName = lib.mkForce "gatewy";'))
    assert "this machine's name `services.mtpstack.hostName` is `gatewy`, which is not declared" in e.value.stderr


def test_a_declared_host_that_runs_nothing_is_a_warning(nixh, nixpkgs_lib):
    result = nixh.eval_module(nixpkgs_lib, "nixos", on_host("gateway", 'services.mtpstack.hosts.spare.address = "10.0.0.99";'))
    assert result["warnings"] == ["no part of the fleet is placed on host `spare` (`services.mtpstack.hosts.spare`)"]


def test_an_unplaced_fleet_runs_whole_on_any_host_name(nixh, nixpkgs_lib):
    single = ROOT / "examples" / "nix" / "valid" / "single-mtp.nix"
    result = nixh.eval_module(nixpkgs_lib, "nixos", f'{{ imports = [ {single} ]; networking.hostName = "anything"; }}')
    assert units(result, "nixos") == ["mtpstack-proxy", "mtpstack-worker-qwen-mtp"]


def test_the_example_flake_deploys_each_host_with_its_modules_via_colmena_and_deploy_rs(nixh, nixpkgs_lib):
    """The example flake's outputs with its inputs replaced by stand-ins that return their arguments."""
    flake = ROOT / "examples" / "fleet" / "flake.nix"
    outputs = nixh.eval(
        f"""
        let
          lib = import {nixpkgs_lib};
          module = name: {{ _file = name; }};
          # Each input's outputs per system, as its flake has them, naming where they come from.
          perSystem = f: lib.genAttrs [ "x86_64-linux" "aarch64-linux" "x86_64-darwin" "aarch64-darwin" ] f;
          outputs = (import {flake}).outputs {{
            self = outputs;
            nixpkgs = {{
              lib = lib // {{ nixosSystem = args: {{ kind = "nixos"; inherit (args) system; n = builtins.length args.modules; }}; }};
              legacyPackages = perSystem (system: {{ mkShell = args: {{ shell = system; inherit (args) packages; }}; }});
            }};
            nix-darwin.lib.darwinSystem = args: {{ kind = "darwin"; inherit (args) system; n = builtins.length args.modules; }};
            deploy-rs = {{
              lib = perSystem (system: {{
                activate.darwin = config: {{ activates = config; }};
                deployChecks = deploy: {{ checks = builtins.attrNames deploy.nodes; on = system; }};
              }});
              apps = perSystem (system: {{ deploy-rs = "deploy-rs app for ${{system}}"; }});
              packages = perSystem (system: {{ deploy-rs = "deploy-rs for ${{system}}"; }});
            }};
            colmena = {{
              lib.makeHive = hive: {{ madeFrom = hive; }};
              apps = perSystem (system: {{ colmena = "colmena app for ${{system}}"; }});
              packages = perSystem (system: {{ colmena = "colmena for ${{system}}"; }});
            }};
            mtpstack = {{ nixosModules.default = module "nixos"; darwinModules.default = module "darwin"; }};
          }};
          hosts = import {HOSTS_NIX};
        in {{
          nixos = outputs.nixosConfigurations;
          darwin = outputs.darwinConfigurations;
          deploy = builtins.mapAttrs (_: n: {{
            inherit (n) hostname sshUser interactiveSudo remoteBuild;
            inherit (n.profiles.system) path user;
          }}) outputs.deploy.nodes;
          colmena = builtins.mapAttrs (_: n: n.deployment) (builtins.removeAttrs outputs.colmenaHive.madeFrom [ "meta" ]);
          colmenaModules = builtins.mapAttrs (_: n: builtins.length n.imports) (builtins.removeAttrs outputs.colmenaHive.madeFrom [ "meta" ]);
          colmenaMeta = outputs.colmenaHive.madeFrom.meta ? nixpkgs;
          hostModules = builtins.mapAttrs (_: h: builtins.length h.modules) hosts;
          inherit (outputs) apps devShells checks;
        }}
        """
    )
    # Each configuration: the platform module, the platform's base settings, then the host's modules.
    plus = 2
    assert outputs["nixos"] == {"gateway": {"kind": "nixos", "system": "x86_64-linux", "n": outputs["hostModules"]["gateway"] + plus}}
    assert set(outputs["darwin"]) == {"mac1", "mac2"}
    # colmena reads `colmenaHive`, made by `colmena.lib.makeHive` from the gateway's hive.
    assert outputs["colmena"] == {"gateway": {"targetHost": "10.0.0.1", "targetUser": "root", "buildOnTarget": True}}
    assert outputs["colmenaModules"] == {"gateway": outputs["hostModules"]["gateway"] + plus}
    assert outputs["colmenaMeta"]
    # colmena and deploy-rs come from the flake's own inputs (colmena's CLI takes only its own version's
    # hive schema: main's makeHive writes v0.5, nixpkgs' colmena 0.4.0 requires v0), for each system one
    # deploys from.
    systems = ["aarch64-darwin", "aarch64-linux", "x86_64-linux"]
    assert outputs["apps"] == {
        s: {"colmena": f"colmena app for {s}", "deploy-rs": f"deploy-rs app for {s}"} for s in systems
    }
    assert outputs["devShells"] == {
        s: {"default": {"shell": s, "packages": [f"colmena for {s}", f"deploy-rs for {s}"]}} for s in systems
    }
    # deploy-rs' deployChecks over the `deploy` output, on a Mac only: they build the darwin systems.
    assert outputs["checks"] == {"aarch64-darwin": {"checks": ["mac1", "mac2"], "on": "aarch64-darwin"}}
    # deploy-rs logs in as an administrator (macOS admits no root SSH), sudoes to root, builds on the Mac.
    assert outputs["deploy"] == {
        name: {"hostname": address, "sshUser": "admin", "interactiveSudo": True, "remoteBuild": True,
               "user": "root", "path": {"activates": outputs["darwin"][name]}}
        for name, address in (("mac1", "10.0.0.11"), ("mac2", "10.0.0.12"))
    }  # fmt: skip


#: A worker across mac1 and mac2 beside the example's two (its gate is the example's, 2).
SPANNING = (
    'services.mtpstack.workers.big = { model = "qwen3.8-27b"; target = { path = "/srv/big"; bits = 4; };'
    ' maxNumSeqs = 2; port = 8102; host = "0.0.0.0"; distributed = { hosts = [ "mac1" "mac2" ]; strategy = "pipeline"; }; };'
)


def test_a_worker_across_two_hosts_runs_a_rank_unit_on_each_and_opens_rank_ports_to_its_peer(nixh, nixpkgs_lib):
    mac1 = nixh.eval_module(nixpkgs_lib, "nixos", on_host("mac1", SPANNING, "networking.nftables.enable = true;"))
    mac2 = nixh.eval_module(nixpkgs_lib, "nixos", on_host("mac2", SPANNING, "networking.nftables.enable = true;"))
    assert units(mac1, "nixos") == ["mtpstack-worker-big", "mtpstack-worker-qwen-a"]
    assert units(mac2, "nixos") == ["mtpstack-worker-big-rank1", "mtpstack-worker-qwen-b"]
    rank0, rank1 = mac1["services"]["mtpstack-worker-big"], mac2["services"]["mtpstack-worker-big-rank1"]
    assert (rank0["environment"]["MLX_RANK"], rank1["environment"]["MLX_RANK"]) == ("0", "1")
    # One hostfile, the same store path on both hosts (pkgs.writeText of the same text).
    assert rank0["environment"]["MLX_HOSTFILE"] == rank1["environment"]["MLX_HOSTFILE"]
    assert rank0["serviceConfig"]["ExecStart"] == rank1["serviceConfig"]["ExecStart"]
    assert rank0["serviceConfig"]["ExecStart"].endswith('"--distributed-backend" "ring" "--distributed-strategy" "pipeline"')
    # Rank ports (port + 10000 + rank) open to the other rank's host only; rank 0 also to the proxy host.
    assert "ip saddr 10.0.0.12 tcp dport 18102 accept\n" in mac1["firewallRules"]["nftables"]
    assert "ip saddr 10.0.0.1 tcp dport 8102 accept\n" in mac1["firewallRules"]["nftables"]
    assert mac2["firewallRules"]["nftables"] == (
        "ip saddr 10.0.0.1 tcp dport 8101 accept\nip saddr 10.0.0.11 tcp dport 18103 accept\n"
    )


def test_a_distributed_worker_whose_deploy_on_is_not_its_first_host_fails_on_every_host(nixh, nixpkgs_lib):
    for host in ("gateway", "mac2"):
        with pytest.raises(nixh.NixError) as e:
            nixh.eval_module(nixpkgs_lib, HOSTS[host], on_host(host, SPANNING, 'services.mtpstack.workers.big.deployOn = "mac2";'))
        assert "`services.mtpstack.workers.big.deployOn` is `mac2`, but the worker spans hosts" in e.value.stderr


#: The worker across mac1 and mac2 over JACCL, with the RDMA devices between the two Macs.
OVER_JACCL = SPANNING + (
    ' services.mtpstack.workers.big.distributed = { backend = "jaccl";'
    ' ibvDevices = [ [ null "rdma_en2" ] [ "rdma_en2" null ] ]; };'
)


def test_a_mac_running_a_jaccl_rank_takes_the_macos_26_wheels_and_gets_the_device_file(nixh, nixpkgs_lib):
    mac2 = nixh.eval_module(nixpkgs_lib, "darwin", on_host("mac2", OVER_JACCL))
    # The package's default is built with the macOS 26 Metal wheels, the only ones with JACCL.
    assert mac2["package"] == {"macosVariant": "26", "jaccl": True}
    env = mac2["daemons"]["mtpstack-worker-big-rank1"]["serviceConfig"]["EnvironmentVariables"]
    assert (env["MLX_RANK"], env["MLX_JACCL_COORDINATOR"]) == ("1", "10.0.0.11:18102")
    assert env["MLX_IBV_DEVICES"].endswith("-mtpstack-big-ibv-devices.json") and "MLX_WORLD_SIZE" not in env
    # A Mac without a jaccl rank keeps the macOS 14 build (it runs on macOS 14 and later).
    gateway_less = nixh.eval_module(nixpkgs_lib, "darwin", on_host("mac2"))
    assert gateway_less["package"] == {"macosVariant": "14", "jaccl": False}


def test_a_jaccl_rank_with_a_package_without_jaccl_is_refused_naming_the_fix(nixh, nixpkgs_lib):
    # An operator's package built from the macOS 14 wheels (the stand-in's passthru says so, as the package's does).
    settings = (
        f"{{ lib, pkgs, ... }}: {{ imports = (import {HOSTS_NIX}).mac1.modules; {OVER_JACCL}"
        ' services.mtpstack.package = lib.mkForce (pkgs.callPackage null { macosVariant = "14"; }); }'
    )
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "darwin", settings)
    assert "worker `big` runs a rank on this Mac with `services.mtpstack.workers.big.distributed.backend` `jaccl`" in e.value.stderr
    assert "MLX compiles it only into the macOS 26 build of its Metal wheels" in e.value.stderr
    assert 'pkgs.callPackage <mtpstack>/modules/package.nix { macosVariant = "26"; }' in e.value.stderr


def test_a_jaccl_rank_on_a_nixos_host_is_refused(nixh, nixpkgs_lib):
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "nixos", on_host("mac1", OVER_JACCL))
    assert "worker `big` runs a rank on this host with `services.mtpstack.workers.big.distributed.backend` `jaccl`, which runs on macOS only" in e.value.stderr


def test_a_jaccl_worker_without_its_devices_fails_every_hosts_evaluation(nixh, nixpkgs_lib):
    missing = SPANNING + ' services.mtpstack.workers.big.distributed.backend = "jaccl";'
    for host in ("gateway", "mac1"):
        with pytest.raises(nixh.NixError) as e:
            nixh.eval_module(nixpkgs_lib, HOSTS[host], on_host(host, missing))
        assert "but `services.mtpstack.workers.big.distributed.ibvDevices` is not set" in e.value.stderr, host


@pytest.mark.parametrize("address", ["fd00::12", "[10.0.0.12]"])
def test_a_ring_host_without_an_ipv4_address_fails_the_evaluation(nixh, nixpkgs_lib, address):
    extra = f'services.mtpstack.hosts.mac2.address = lib.mkForce "{address}";'
    with pytest.raises(nixh.NixError) as e:
        nixh.eval_module(nixpkgs_lib, "darwin", on_host("mac1", SPANNING, extra))
    assert f"by IPv4 address (MLX splits `address:port` at the first colon and opens IPv4 sockets), but `services.mtpstack.hosts.mac2.address` is `{address}`" in e.value.stderr
