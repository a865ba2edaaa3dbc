"""Event ids drawn by the drivers when the caller gives none (``outpost_io/ids.py``)."""

from __future__ import annotations

import os
import uuid

from outpost_io.ids import new_event_id


def test_ids_are_random_uuid4s_in_hex_and_never_repeat() -> None:
    ids = [new_event_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    for text in ids[:600]:  # across more than one refill of the pool
        parsed = uuid.UUID(text)
        assert parsed.hex == text
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_a_forked_child_does_not_reuse_its_parents_ids() -> None:
    new_event_id()  # the parent holds a pool of ids it has not used yet
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe, then leaves at once
        os.write(write, new_event_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert child != new_event_id()
