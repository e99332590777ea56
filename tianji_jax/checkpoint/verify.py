"""Integrity of checkpoints: per-leaf checksums and one-line reasons for unreadable ones (resuming
from the newest intact checkpoint of a run is :mod:`tianji_jax.checkpoint.fallback`).

* Checksums (:func:`leaf_checksums`): each saved leaf is viewed as unsigned 32-bit words (floats
  bitcast, 1- and 2-byte types widened, 8-byte types split in two words, bools as 0/1), each
  word ``w_i`` passed through a bijective bit mixer ``m``, and reduced on its own device to
  ``sum_i (2 i + 1) * m(w_i) mod 2**32``. The weights are odd and ``m`` is a bijection, so any
  change of one word (a flipped bit, a zeroed or garbled value) changes the sum; the reduction is
  exact integer arithmetic, hence the same on every backend and in every reduction order. It
  costs one fused pass over the state, cheap next to writing it, even for a replay buffer of
  several GB. :class:`~tianji_jax.checkpoint.core.RunCheckpointer` stores them in each leaf's record
  of ``meta["leaves"]`` at save time and verifies them after a restore, on the host arrays read,
  with the same arithmetic in numpy (:func:`host_leaf_checksums`: a restore compiles nothing);
  checkpoints written before checksums existed are restored unverified.
* File digests of every file of a checkpoint: :mod:`tianji_jax.checkpoint.digests`.
* Unreadable checkpoints: orbax's restore gathers its array reads in an event loop that it closes
  as soon as one read fails; the reads still in flight then complete into the closed loop, and
  tensorstore reports each as an unraisable ``RuntimeError: Event loop is closed`` (and each
  abandoned read coroutine as an ignored exception when collected), and asyncio logs each failed
  read task or future that nobody awaited as ``Task exception was never retrieved`` with its
  traceback when garbage collection frees it. :func:`quiet_abandoned_reads` drops exactly these
  reports; :func:`one_line` reduces orbax's error (which embeds the whole TensorStore spec) to the
  first line of its root cause.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["leaf_checksums", "host_leaf_checksums", "one_line", "quiet_abandoned_reads", "warn"]


def _checksum_supported(dtype: Any) -> bool:
    dt = np.dtype(dtype)
    return dt == np.bool_ or jnp.issubdtype(dt, jnp.integer) or jnp.issubdtype(dt, jnp.floating)


def _words(x: jax.Array) -> jax.Array:
    """``x`` as a flat vector of uint32 words."""
    size = np.dtype(x.dtype).itemsize
    if x.dtype == jnp.bool_:
        u = x.astype(jnp.uint32)
    elif size >= 4:  # 8-byte types become (..., 2) words
        u = jax.lax.bitcast_convert_type(x, jnp.uint32)
    else:
        u = jax.lax.bitcast_convert_type(x, jnp.uint16 if size == 2 else jnp.uint8).astype(jnp.uint32)
    return u.reshape(-1)


def _mix(h: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 that spreads every bit over the word
    (so words with many zero low bits, like 1.0 or 0.5, do not make changes cancel mod 2**32)."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _weighted_sum(x: jax.Array) -> jax.Array:
    u = _mix(_words(x))
    weights = jax.lax.iota(jnp.uint32, u.shape[0]) * jnp.uint32(2) + jnp.uint32(1)
    return jnp.sum(weights * u, dtype=jnp.uint32)


_sums = jax.jit(lambda xs: [_weighted_sum(x) for x in xs])


def leaf_checksums(arrays: dict[str, Any]) -> dict[str, int]:
    """The checksum (an int in ``[0, 2**32)``, see the module docstring) of each array of ``arrays``.

    Computed with one jitted call per device set (a learner's and an actor's leaves may live on
    different devices), on those devices. Leaves of other dtypes (complex, ...), empty ones and
    arrays this process cannot address in full are left out of the result.
    """
    groups: dict[Any, list[str]] = {}
    for key, x in arrays.items():
        if not _checksum_supported(x.dtype) or np.size(x) == 0:
            continue
        if isinstance(x, jax.Array):
            if not x.is_fully_addressable:
                continue
            devices = frozenset(x.sharding.device_set)
        else:
            devices = None
        groups.setdefault(devices, []).append(key)
    started = [(keys, _sums([arrays[k] for k in keys])) for keys in groups.values()]
    out = {}
    for keys, sums in started:
        out.update({k: int(v) for k, v in zip(keys, jax.device_get(sums))})
    return out


_HOST_CHUNK = 1 << 20  # words per numpy pass of host_leaf_checksums (4 MiB buffers, reused)


def _host_words(x: np.ndarray) -> np.ndarray:
    """``x`` flat, viewed as the unsigned integers :func:`_words` widens to uint32 words (an 8-byte
    value as its two words in memory order, as ``bitcast_convert_type`` splits it on a
    little-endian host; bools as their bytes, 0 or 1)."""
    if not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    x = np.ascontiguousarray(x).reshape(-1)
    size = x.dtype.itemsize
    if x.dtype == np.bool_:
        return x.view(np.uint8)
    return x.view(np.uint32 if size >= 4 else np.uint16 if size == 2 else np.uint8)


def _host_checksum(words: np.ndarray) -> int:
    """``sum_i (2 i + 1) * m(w_i) mod 2**32`` of :func:`_weighted_sum`, in numpy passes of
    :data:`_HOST_CHUNK` words into reused buffers (uint32 arithmetic wraps as XLA's does)."""
    n = words.shape[0]
    chunk = min(n, _HOST_CHUNK)
    odd = np.arange(1, 2 * chunk, 2, dtype=np.uint32)  # 2 i + 1 for the first chunk
    h, tmp, weights = np.empty(chunk, np.uint32), np.empty(chunk, np.uint32), np.empty(chunk, np.uint32)
    total = 0
    for start in range(0, n, _HOST_CHUNK):
        m = min(_HOST_CHUNK, n - start)
        hh, tt, ww = h[:m], tmp[:m], weights[:m]
        np.copyto(hh, words[start:start + m], casting="unsafe")  # widened to uint32
        for shift, factor in ((16, 0x85EBCA6B), (13, 0xC2B2AE35), (16, None)):  # _mix
            np.right_shift(hh, shift, out=tt)
            np.bitwise_xor(hh, tt, out=hh)
            if factor is not None:
                np.multiply(hh, np.uint32(factor), out=hh)
        np.add(odd[:m], np.uint32((2 * start) & 0xFFFFFFFF), out=ww)  # 2 (start + i) + 1
        np.multiply(hh, ww, out=hh)
        total = (total + int(np.add.reduce(hh, dtype=np.uint32))) & 0xFFFFFFFF
    return total


def host_leaf_checksums(arrays: dict[str, Any]) -> dict[str, int]:
    """:func:`leaf_checksums` of host (numpy) arrays, computed with numpy: the same integers, and
    nothing is compiled (a restore verifies its arrays before they are placed on a device, with
    no program that the run it continues does not compile anyway).

    Args:
        arrays: ``{key: array}``; numpy arrays or anything ``np.asarray`` takes.

    Returns:
        ``{key: checksum}`` (ints in ``[0, 2**32)``), leaving out the leaves
        :func:`leaf_checksums` leaves out (other dtypes, empty ones).
    """
    out = {}
    for key, x in arrays.items():
        x = np.asarray(x)
        if _checksum_supported(x.dtype) and x.size:
            out[key] = _host_checksum(_host_words(x))
    return out


_SPEC_DUMP = re.compile(r"\s*See full TensorStore details:.*", re.S)
_SOURCE_LOCATIONS = re.compile(r"\s*\[source locations=.*?\]")


def one_line(err: BaseException, limit: int = 400) -> str:
    """``err`` as one line: the first line of the root of its cause chain, as ``Type: message``,
    without TensorStore spec dumps or source locations, cut to ``limit`` characters."""
    root, seen = err, 0
    while seen < 20:
        nxt = root.__cause__ or (None if root.__suppress_context__ else root.__context__)
        if nxt is None:
            break
        root, seen = nxt, seen + 1
    text = _SOURCE_LOCATIONS.sub("", _SPEC_DUMP.sub("", str(root))).strip()
    text = " ".join(text.splitlines()[0].split()) if text else ""
    text = f"{type(root).__name__}: {text}" if text else type(root).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _abandoned_read_noise(unraisable: Any) -> bool:
    """An unraisable report of a read abandoned by a failed orbax restore (see the module docstring)."""
    exc, obj = unraisable.exc_value, unraisable.object
    if obj is None and isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
        return True
    code = getattr(obj, "cr_code", None)  # a coroutine of orbax's restore, closed when collected
    return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


_NEVER_RETRIEVED = ("Task exception was never retrieved", "Future exception was never retrieved")


def _from_orbax_read(exc: BaseException | None, message: str) -> bool:
    """``exc`` (logged with ``message``) is the error of an orbax/tensorstore read: orbax's read
    coroutine is named in the message, a frame of its traceback is orbax's or tensorstore's, or
    its text embeds a TensorStore spec (tensorstore's errors do; their futures carry no traceback)."""
    if exc is None:
        return False
    if f"{os.sep}orbax{os.sep}" in message or "tensorstore_spec" in str(exc):
        return True
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if f"{os.sep}orbax{os.sep}" in name or f"{os.sep}tensorstore{os.sep}" in name:
            return True
        tb = tb.tb_next
    return False


class _AbandonedReadLogFilter(logging.Filter):
    """Drops asyncio's ``Task/Future exception was never retrieved`` records of orbax's reads
    abandoned by a failed restore (logged when garbage collection frees them, long after the
    restore); every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(_NEVER_RETRIEVED):
            return True
        return not _from_orbax_read(record.exc_info[1] if record.exc_info else None, message)


_ASYNCIO_FILTER = _AbandonedReadLogFilter()


@contextlib.contextmanager
def quiet_abandoned_reads() -> Iterator[None]:
    """Around an orbax restore: drop the reports of the reads it abandons when it fails -- the
    unraisable ones (all other reports go to the previous ``sys.unraisablehook``) and asyncio's
    ``... exception was never retrieved`` log records of those reads (a filter on the ``asyncio``
    logger). Those reads complete, and are collected, later, so after a failure both filters stay
    installed; after a success they are removed."""
    previous = sys.unraisablehook
    if getattr(previous, "_tianji_quiet", False):  # already filtering (an earlier failure)
        yield
        return

    def hook(unraisable: Any) -> None:
        if not _abandoned_read_noise(unraisable):
            previous(unraisable)

    hook._tianji_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
    asyncio_logger = logging.getLogger("asyncio")
    added = _ASYNCIO_FILTER not in asyncio_logger.filters
    if added:
        asyncio_logger.addFilter(_ASYNCIO_FILTER)
    ok = False
    try:
        yield
        ok = True
    finally:
        if ok and sys.unraisablehook is hook:
            sys.unraisablehook = previous
        if ok and added:
            asyncio_logger.removeFilter(_ASYNCIO_FILTER)


def warn(message: str) -> None:
    """Print one line to stderr (a skipped checkpoint, a continuation directory)."""
    print(message, file=sys.stderr, flush=True)
