"""Prometheus text read back into numbers: the one parser of `/metrics`, for the proxy's fleet view
(which scrapes every worker), `mtpstack bench` and the benchmark scripts (the bench may import this
module of the proxy's layer; tests/test_layout.py says so).

Parsing is `prometheus_client`'s own (`text_string_to_metric_families`), so what the proxy and
the worker expose is read by the library that writes it. The worker's series names are in
`mtpstack.series`.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

#: {sample name: {((label, value), ...) sorted: value}}
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def parse_samples(text: str, strict: bool = False) -> Samples:
    """Every sample in `text`, by name and sorted labels. Text that stops parsing (a truncated
    scrape) gives the samples before the break, or with `strict` raises the parser's ValueError."""
    out: Samples = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = float(s.value)
    except ValueError:
        if strict:
            raise
    return out


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the one series of `name` with exactly `labels`; None when absent."""
    return samples.get(name, {}).get(tuple(sorted(labels.items())))


def labelled(samples: Samples, name: str) -> list[tuple[dict[str, str], float]]:
    """Every series of `name` as (labels, value)."""
    return [(dict(labels), value) for labels, value in samples.get(name, {}).items()]


def unlabelled(text: str, names: Iterable[str]) -> dict[str, float]:
    """The unlabelled samples of `names` present in `text` (counters such as `..._total`)."""
    samples = parse_samples(text)
    return {n: v for n in names if (v := sample(samples, n)) is not None}
