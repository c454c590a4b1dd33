"""Per-zone GPU VM prices: infra/prices.csv (source and date in its header), parsed once.

Unknown is None, never 0; a row that says 0 is refused. infra/offers.py ranks with these.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

UNKNOWN = "unknown"


@dataclass(frozen=True)
class ZonePrice:
    """USD per hour of one VM of an item in one zone; None = unknown (never 0)."""

    on_demand: float | None
    spot: float | None
    note: str = ""

    def hourly(self, spot: bool) -> float | None:
        return self.spot if spot else self.on_demand


@dataclass(frozen=True)
class PriceTable:
    """Per-zone prices by item (a machine type, or an N1 attachable GPU priced per GPU)."""

    source: str
    as_of: str
    items: Mapping[str, Mapping[str, ZonePrice]]

    @property
    def date(self) -> str:
        """The ISO date of `as_of` (the rest of that line says what the date means)."""
        return self.as_of.split()[0]

    def get(self, item: str, zone: str) -> ZonePrice | None:
        return self.items.get(item, {}).get(zone)

    def zones(self, item: str) -> frozenset[str]:
        return frozenset(self.items.get(item, {}))


def expand_zones(spec: str) -> list[str]:
    """Expand us-central1-a/b/c into us-central1-a, us-central1-b, us-central1-c."""
    region, letters = spec.strip().rsplit("-", 1)
    return [f"{region}-{letter}" for letter in letters.split("/")]


def _figure(text: str, where: str) -> float | None:
    if text == UNKNOWN:
        return None
    value = float(text)
    if value <= 0:
        raise ValueError(f"{where}: price {text!r}; write 'unknown', never 0")
    return value


def parse_prices(text: str) -> PriceTable:
    """The price table in prices.csv's format; ValueError names the line of a bad row."""
    meta: dict[str, str] = {}
    body = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep and key.strip() in ("source", "as_of"):
                meta[key.strip()] = value.strip()
        elif line.strip():
            body.append((number, line))
    items: dict[str, dict[str, ZonePrice]] = {}
    rows = csv.DictReader(line for _, line in body)
    for (number, _), row in zip(body[1:], rows, strict=True):
        where = f"prices.csv line {number}"
        price = ZonePrice(
            _figure(row["on_demand"], where), _figure(row["spot"], where), row["note"] or ""
        )
        for zone in expand_zones(row["zones"]):
            if zone in items.setdefault(row["item"], {}):
                raise ValueError(f"{where}: {row['item']} in {zone} is listed twice")
            items[row["item"]][zone] = price
    if set(meta) != {"source", "as_of"}:
        raise ValueError("prices.csv: the header must state '# source:' and '# as_of:'")
    return PriceTable(meta["source"], meta["as_of"], items)


@functools.cache
def price_table() -> PriceTable:
    """infra/prices.csv, parsed on first use."""
    return parse_prices(resources.files("infra").joinpath("prices.csv").read_text())
