"""`mtpstack up` keeps each native worker's prefix-cache disk tier in its run directory, so the next run
resumes conversations from it, unless the config names a directory."""

from __future__ import annotations

from mtpstack.up import Stack
from mtpstack.validator import validate_data


def stack(tmp_path, **workers) -> Stack:
    fleet = {"policy": {"allowedBackends": ["native", "mlx-lm"]}, "workers": {name: {"model": name, "target": {"path": "t", "bits": 4}, "maxNumSeqs": 1, "port": 8101 + i, **w}
                         for i, (name, w) in enumerate(workers.items())}}
    config, report = validate_data(fleet)
    assert config is not None and report.ok, report.render_text()
    return Stack(config, tmp_path, health_timeout=1)


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_a_worker_without_a_cache_directory_keeps_its_disk_tier_in_the_run_directory(tmp_path):
    s = stack(tmp_path, a={}, b={"prefixCache": {"dir": "/srv/cache-b", "diskGiB": 4}})
    argv = {m.name: m.argv for m in s.workers}
    assert flag(argv["a"], "--prefix-cache-dir") == str(tmp_path / "prefix-cache" / "a")
    assert flag(argv["a"], "--prefix-cache-disk-gib") == "32"
    assert (flag(argv["b"], "--prefix-cache-dir"), flag(argv["b"], "--prefix-cache-disk-gib")) == ("/srv/cache-b", "4")
    # The effective config the proxy reads is the operator's, unchanged.
    assert s.config.workers["a"].prefix_cache.dir is None


def test_an_mlx_lm_worker_gets_no_disk_tier(tmp_path):
    s = stack(tmp_path, m={"backend": "mlx-lm"})
    assert str(tmp_path) not in " ".join(s.workers[0].argv)
