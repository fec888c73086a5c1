"""Scraping ``/metrics`` (the server's or an agent's) into samples that tests compare before and after."""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: What an id looks like in a label value: a UUID, or a long run of hex digits.
ID_LIKE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{16,}", re.I)


@dataclass(frozen=True)
class Scrape:
    """One scrape: every sample by name and labels."""

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    def value(self, name: str, **labels: str) -> float:
        """The sample's value; 0 when the scrape has none (a counter or child not yet made)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)

    def label_values(self) -> set[tuple[str, str, str]]:
        """(sample name, label name, value) of every labelled sample."""
        return {(n, k, v) for (n, ls) in self.samples for k, v in ls}


def parse(text: str) -> Scrape:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Scrape(samples)


def scrape(url: str) -> Scrape:
    """GET ``url`` (a ``/metrics`` URL) and parse the answer; asserts a 200 in Prometheus' text format."""
    response = httpx.get(url, timeout=30)
    assert 200 == response.status_code, response.text
    assert response.headers["content-type"].startswith("text/plain"), response.headers["content-type"]
    return parse(response.text)


def scrape_registry() -> Scrape:
    """This process's own metrics (the in-process app's), as ``/metrics`` would answer them."""
    from prometheus_client import generate_latest

    from orchestrator.metrics import REGISTRY

    return parse(generate_latest(REGISTRY).decode())
