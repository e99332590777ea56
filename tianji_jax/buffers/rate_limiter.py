"""Balance of sample production and consumption: Reverb's SampleToInsertRatio semantics.

Counted in items (env steps). With inserts ``I`` (dropped items removed), samples ``S`` (reuse
counted), target ``spi``, ``min_size`` and bounds ``min_diff <= I*spi - S <= max_diff``::

    can_sample(n) = I >= min_size and I*spi - S - n >= min_diff
    can_insert(n) = I + n <= min_size or (I + n)*spi - S <= max_diff

Whole batches of ``B`` items are sampled and chunks of ``c`` inserted, so the band must satisfy
``max_diff - min_diff >= B + spi*c`` or both sides can block forever (docs/runtime.md, "The lag contract"); this is
checked at construction. The limiter holds counters only; the buffer that owns it serialises
access and does the condition waits.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RateLimiter"]


@dataclass
class RateLimiter:
    """Counters and admission predicates of a sample-to-insert rate limiter.

    Args:
        spi: target samples per insert (> 0); PPO uses 1 (each step consumed once).
        min_size: inserts before any sample is allowed (>= 1), in items.
        min_diff, max_diff: band of ``I*spi - S`` in items.
        batch_items: ``B``, items per sample call.
        chunk_items: ``c``, items per insert call.

    Raises:
        ValueError: ``spi <= 0``, ``min_size < 1``, ``min_diff > max_diff``, or a band too narrow
            for the batch and chunk sizes (the deadlock rule), naming the values.
    """

    spi: float
    min_size: int
    min_diff: float
    max_diff: float
    batch_items: int
    chunk_items: int
    inserted: int = 0
    sampled: int = 0
    dropped: int = 0

    def __post_init__(self) -> None:
        if not self.spi > 0:
            raise ValueError(f"spi must be > 0, got {self.spi}")
        if self.min_size < 1:
            raise ValueError(f"min_size must be >= 1, got {self.min_size}")
        if self.min_diff > self.max_diff:
            raise ValueError(f"min_diff={self.min_diff} must be <= max_diff={self.max_diff}")
        need = self.batch_items + self.spi * self.chunk_items
        if self.max_diff - self.min_diff < need:
            raise ValueError(
                f"rate limiter band too narrow: max_diff - min_diff = {self.max_diff} - {self.min_diff} = "
                f"{self.max_diff - self.min_diff} < batch_items + spi * chunk_items = {self.batch_items} + "
                f"{self.spi} * {self.chunk_items} = {need}; both sides could block forever. Widen the band "
                f"(e.g. more batches in flight)")

    @property
    def error(self) -> float:
        """``I*spi - S``: items of sampling credit (the quantity kept inside the band)."""
        return self.inserted * self.spi - self.sampled

    def can_sample(self, n: int) -> bool:
        """Whether ``n`` items may be sampled now: ``I >= min_size`` and ``I*spi - S - n >= min_diff``."""
        return self.inserted >= self.min_size and self.error - n >= self.min_diff

    def can_insert(self, n: int) -> bool:
        """Whether ``n`` items may be inserted now: ``I + n <= min_size`` or
        ``(I + n)*spi - S <= max_diff``."""
        return self.inserted + n <= self.min_size or (self.inserted + n) * self.spi - self.sampled <= self.max_diff

    def record_insert(self, n: int) -> None:
        """Count ``n`` inserted items (no check: ask :meth:`can_insert` first)."""
        self.inserted += n

    def record_sample(self, n: int) -> None:
        """Count ``n`` sampled items (no check: ask :meth:`can_sample` first)."""
        self.sampled += n

    def record_drop(self, n: int) -> None:
        """Dropped items leave the insert count, so credit for them does not linger."""
        self.inserted -= n
        self.dropped += n
