"""Scraping /metrics the way Prometheus does, and reading the answer with prometheus_client's own parser."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from tests.conftest import make_token


@pytest.fixture
def read_token(sessions: sessionmaker[Session]) -> str:
    return make_token(sessions, "read")


@dataclass
class Scrape:
    families: dict[str, Metric]

    def value(self, sample: str, **labels: str) -> float | None:
        """The value of one sample, by sample name (`..._total`, `..._bucket`) and labels; None if absent."""
        for family in self.families.values():
            for s in family.samples:
                if s.name == sample and s.labels == labels:
                    return s.value
        return None

    def labelled(self, family: str) -> dict[tuple[str, ...], float]:
        """Every sample of a family, by its label values in label-name order."""
        return {tuple(v for _k, v in sorted(s.labels.items())): s.value for s in self.families[family].samples}


def parse(text: str) -> Scrape:
    return Scrape({f.name: f for f in text_string_to_metric_families(text)})


def scrape(client: TestClient, token: str) -> Scrape:
    r = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return parse(r.text)
