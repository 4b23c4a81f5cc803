"""Prometheus text read back into numbers: the one parser of `/metrics` for the bench and the benchmark scripts.

Parsing is `prometheus_client`'s own (`text_string_to_metric_families`), so what the proxy and
the worker expose is read by the library that writes it.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

#: {sample name: {((label, value), ...) sorted: value}}
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def parse_samples(text: str) -> Samples:
    """Every sample in `text`, by name and sorted labels. Text that stops parsing (a truncated
    scrape) gives the samples before the break."""
    out: Samples = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = float(s.value)
    except ValueError:
        pass
    return out


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the one series of `name` with exactly `labels`; None when absent."""
    return samples.get(name, {}).get(tuple(sorted(labels.items())))


def unlabelled(text: str, names: Iterable[str]) -> dict[str, float]:
    """The unlabelled samples of `names` present in `text` (counters such as `..._total`)."""
    samples = parse_samples(text)
    return {n: v for n in names if (v := sample(samples, n)) is not None}
