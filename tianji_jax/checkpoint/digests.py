"""File digests of checkpoints: the size and sha256 of every file of a checkpoint's step
directory, so that no changed byte of any file loads silently.

Once orbax has completed a checkpoint, :class:`~tianji_jax.checkpoint.core.RunCheckpointer` writes
``<step>/`` :data:`DIGESTS_FILE` (:func:`write_file_digests`, driven by :class:`DigestWriter`):
the size and sha256 of every other file of the step directory (orbax's metadata, the OCDBT
manifests and data files, tianji's ``meta``, the metrics), sealed by the sha256 of its own
content. Reading the metadata checks every file but the array data (``state/``) first; a restore
checks every file after orbax's read and the per-leaf checksums (whose errors name the leaf)
(:func:`check_file_digests`). So any changed byte of any file -- also bytes that orbax's layout
leaves unread (a process-level b-tree node superseded by the merged one, in a data file of its
own or after array chunks, as the writes happened to be grouped) and those the per-leaf checksums
cannot see (the metadata: rows, config, leaf records) -- makes the checkpoint corrupt instead of
loading silently. A byte flip cannot delete a file, so a checkpoint that has the digest file is
always checked; one without it (written before digests existed, or by a process killed in the
moment between orbax's commit and the digest write) is read as before, verified by the per-leaf
checksums.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Callable

__all__ = ["DIGESTS_FILE", "write_file_digests", "check_file_digests", "DigestWriter"]


DIGESTS_FILE = "tianji_file_digests.json"
"""The file of a checkpoint's step directory that records the size and sha256 of each of its other
files (:func:`write_file_digests`): ``{"version": 1, "files": {relative path: [size, sha256 hex]},
"sha256": <sha256 of the canonical JSON of the two other keys>}``."""

_DIGESTS_VERSION = 1


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _seal(body: dict) -> str:
    """The sha256 of ``body`` as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _step_files(step_dir: Path) -> list[str]:
    """The files under ``step_dir`` (relative POSIX paths, sorted), the digest file and its
    temporary copy excluded."""
    skip = {DIGESTS_FILE, DIGESTS_FILE + ".tmp"}
    return sorted(p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*")
                  if p.is_file() and p.relative_to(step_dir).as_posix() not in skip)


def write_file_digests(step_dir: str | Path) -> Path:
    """Record the size and sha256 of every file under ``step_dir`` (a complete checkpoint's step
    directory) in ``step_dir /`` :data:`DIGESTS_FILE`, written atomically (a temporary file,
    flushed to disk, then renamed).

    Returns:
        The digest file's path.

    Raises:
        OSError: a file cannot be read or the digest file cannot be written.
    """
    step_dir = Path(step_dir)
    files = {rel: [(step_dir / rel).stat().st_size, _file_sha256(step_dir / rel)] for rel in _step_files(step_dir)}
    body = {"version": _DIGESTS_VERSION, "files": files}
    tmp, out = step_dir / (DIGESTS_FILE + ".tmp"), step_dir / DIGESTS_FILE
    with open(tmp, "w") as f:
        json.dump({**body, "sha256": _seal(body)}, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    return out


def check_file_digests(step_dir: str | Path, select: Callable[[str], bool] | None = None) -> bool:
    """Check the files of ``step_dir`` against its :data:`DIGESTS_FILE`.

    Args:
        step_dir: a checkpoint's step directory.
        select: ``relative path -> bool``: only the recorded files it selects are checked (None:
            all); the digest file's own seal is always checked.

    Returns:
        True when the selected files match their digests; False when ``step_dir`` has no digest
        file (a checkpoint written before they existed: nothing is checked).

    Raises:
        ValueError: one line naming what failed: the digest file is unreadable or fails its own
            seal, a recorded file is missing, has another size or fails its sha256.
    """
    step_dir = Path(step_dir)
    path = step_dir / DIGESTS_FILE
    if not path.is_file():
        return False
    try:
        record = json.loads(path.read_bytes())
        body = {"version": record["version"], "files": record["files"]}
        sealed = record["sha256"] == _seal(body)
    except (ValueError, KeyError, TypeError) as err:  # not JSON, not UTF-8, keys missing, not a dict
        raise ValueError(f"{DIGESTS_FILE} is unreadable ({type(err).__name__}): it is corrupt") from None
    if not sealed:
        raise ValueError(f"{DIGESTS_FILE} fails its own sha256: it is corrupt")
    if body["version"] != _DIGESTS_VERSION:
        raise ValueError(f"{DIGESTS_FILE} has version {body['version']!r}; this version reads {_DIGESTS_VERSION}")
    for rel, (size, digest) in sorted(body["files"].items()):
        if select is not None and not select(rel):
            continue
        f = step_dir / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise ValueError(f"{DIGESTS_FILE} names a file outside the checkpoint: {rel!r}")
        if not f.is_file():
            raise ValueError(f"file {rel} is missing")
        if f.stat().st_size != size:
            raise ValueError(f"file {rel} has {f.stat().st_size} bytes, {size} were written: it is truncated or garbled")
        if _file_sha256(f) != digest:
            raise ValueError(f"file {rel} fails its sha256: its data is corrupt")
    return True


class DigestWriter:
    """Writes the file digests of the checkpoints one run saves into ``directory``
    (``RUN_DIR/checkpoints``), as soon as each is complete: a synchronous save's at once, an
    asynchronous one's from a watcher thread that waits for orbax to rename its temporary
    directory to ``<step>`` (after which nothing in it changes), so a process killed later still
    leaves them; :meth:`settle` makes sure of every pending one.

    Args:
        directory: the checkpoints' directory.
    """

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._pending: list[int] = []
        self._watchers: list[threading.Thread] = []
        self._stop = threading.Event()

    def started(self, step: int, complete: bool) -> None:
        """A save of ``step`` started; ``complete``: it is already complete (a synchronous save)."""
        self._pending.append(int(step))
        if complete:
            self.settle()
            return
        watcher = threading.Thread(target=self._when_complete, args=(int(step),), daemon=True,
                                   name=f"tianji-digests-{int(step)}")
        watcher.start()
        self._watchers.append(watcher)

    def _when_complete(self, step: int) -> None:
        final = self.directory / str(step)
        while not self._stop.is_set():
            if final.is_dir():
                with contextlib.suppress(OSError):  # written again by settle, which reports a failure
                    write_file_digests(final)
                return
            self._stop.wait(0.05)

    def settle(self) -> None:
        """Once every pending save is finished (the caller waited for orbax): stop the watchers and
        write the digests of each pending step that is complete and lacks them.

        Raises:
            OSError: a file cannot be read or the digest file cannot be written.
        """
        self.stop()
        for step in self._pending:
            final = self.directory / str(step)
            if final.is_dir() and not (final / DIGESTS_FILE).is_file():
                write_file_digests(final)
        self._pending.clear()

    @property
    def pending(self) -> bool:
        """Some started save has not been settled."""
        return bool(self._pending)

    def stop(self) -> None:
        """Stop and join the watcher threads (a failed save never completes)."""
        self._stop.set()
        for watcher in self._watchers:
            watcher.join()
        self._watchers.clear()
        self._stop.clear()
