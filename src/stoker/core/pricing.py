"""What reading a dataset costs: requests and bytes, priced."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class StoragePrices:
    """Prices of reading from an object store, in dollars (or any one currency).

    The defaults are AWS S3 Standard's list prices in us-east-1 (2025): GET requests at
    $0.0004 per 1,000, and no charge for bytes read from the same region. Reading across
    regions or over the internet costs per byte: set ``transfer_per_gib`` (AWS internet
    egress starts at $0.09/GB; R2 and IBM COS Smart Tier differ; see your provider).

    Attributes:
        get_per_1000: Price of 1,000 GET requests.
        transfer_per_gib: Price of one GiB read.
    """

    get_per_1000: float = 0.0004
    transfer_per_gib: float = 0.0

    def __post_init__(self) -> None:
        if self.get_per_1000 < 0 or self.transfer_per_gib < 0:
            raise ValueError("prices must be >= 0")

    def cost(self, *, requests: float, nbytes: float) -> float:
        """The price of ``requests`` GETs that read ``nbytes`` bytes."""
        return requests / 1000 * self.get_per_1000 + nbytes / 2**30 * self.transfer_per_gib


@dataclass(frozen=True, slots=True)
class EpochCost:
    """Requests, bytes and price of one epoch's reads from the store.

    Attributes:
        requests: GET requests.
        bytes: Bytes read.
        price: Their price under the prices used.
    """

    requests: float
    bytes: float
    price: float

    def to_dict(self) -> dict[str, float]:
        """A JSON-ready dict."""
        return {"requests": round(self.requests), "bytes": round(self.bytes), "price": self.price}
