from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def core_logs_nothing() -> Iterator[None]:
    """The core reports what its driver should log and never logs itself: in every core test, a
    handler on the "outpost" logger, at debug, sees nothing."""
    logger = logging.getLogger("outpost")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert [r.getMessage() for r in handler.records] == []
