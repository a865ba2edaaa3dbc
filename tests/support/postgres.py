"""A PostgreSQL for the tests that ask a real one: ``DATABASE_URL``, else the server on
127.0.0.1:5432 (database ``test``), else one started from ``initdb``/``pg_ctl`` in a temporary
directory (on PATH or in Debian's /usr/lib/postgresql/*/bin), else a skip with the reason."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

LOCAL_DSNS = (
    "host=127.0.0.1 port=5432 dbname=test user=postgres connect_timeout=3",
    "host=127.0.0.1 port=5432 dbname=test user=root connect_timeout=3",
)


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _own_server(psycopg: Any) -> Iterator[Any]:
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("no PostgreSQL: DATABASE_URL unset, none on 127.0.0.1:5432, no initdb")
    with tempfile.TemporaryDirectory(prefix="outpost-pg-") as tmp:
        data, port = Path(tmp) / "data", _free_port()
        done = subprocess.run(
            [initdb, "-D", str(data), "-U", "postgres", "--auth=trust"],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"no PostgreSQL: initdb failed ({done.stderr.decode()[-200:]!r})")
        options = f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1"
        subprocess.run(
            [pg_ctl, "-D", str(data), "-o", options, "-w", "start", "-l", f"{tmp}/log"],
            check=True,
            capture_output=True,
        )
        try:
            dsn = f"host=127.0.0.1 port={port} dbname=postgres user=postgres"
            with psycopg.connect(dsn, autocommit=True) as connection:
                yield connection
        finally:
            subprocess.run(
                [pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
                check=False,
                capture_output=True,
            )


@contextlib.contextmanager
def postgres_connection() -> Iterator[Any]:
    psycopg = pytest.importorskip("psycopg", reason="psycopg (v3) is not installed")
    dsns = [os.environ["DATABASE_URL"]] if os.environ.get("DATABASE_URL") else list(LOCAL_DSNS)
    for dsn in dsns:
        try:
            connection = psycopg.connect(dsn, autocommit=True)
        except psycopg.OperationalError:
            continue
        with connection:
            yield connection
        return
    with _own_server(psycopg) as connection:
        yield connection
