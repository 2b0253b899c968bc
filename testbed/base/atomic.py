"""Files written whole or not at all: into a temporary file beside the target, synced, then
renamed over it, so a crash leaves the previous complete file or none, never a truncated one.
Light on purpose (the agents and the emulator import it)."""
from __future__ import annotations

import contextlib
import json
import os
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "w", sync: bool = True, **open_args) -> Iterator[IO]:
    """An open temporary file that replaces ``path`` when the block ends without error.
    ``sync``: on disk before the rename (a power cut too); without, a crashed process is
    covered, not the machine."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, mode, **open_args) as f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str, data: bytes) -> None:
    with atomic_file(path, "wb") as f:
        f.write(data)


def write_json_atomic(path: str, data, indent: int = 2) -> None:
    write_atomic(path, (json.dumps(data, indent=indent) + "\n").encode("utf-8"))
