"""The TLS context is made once a process for each version of a CA bundle: loading one takes
about as long as everything else an instance's construction does."""

from __future__ import annotations

import shutil
from pathlib import Path

import certifi
import pytest

from outpost_core import UsageError
from outpost_io import tls
from outpost_io.tls import tls_context


def test_instances_share_the_context_of_one_bundle(tmp_path: Path) -> None:
    assert tls_context(True) is tls_context(True)
    bundle = tmp_path / "ca.pem"
    shutil.copyfile(certifi.where(), bundle)
    assert tls_context(str(bundle)) is tls_context(bundle)
    assert tls_context(str(bundle)) is not tls_context(True)


def test_a_bundle_that_changed_on_disk_is_loaded_again(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    shutil.copyfile(certifi.where(), bundle)
    before = tls_context(bundle)
    with bundle.open("a") as extra:
        extra.write("\n")  # a rotated bundle: another size, another time
    after = tls_context(bundle)
    assert after is not before
    assert tls_context(bundle) is after  # the new version is the one kept
    kept = [key for key in tls._CONTEXTS if key[0] == str(bundle)]
    assert len(kept) == 1  # one context a bundle, whatever its versions


def test_a_bundle_that_cannot_be_read_still_raises_at_each_construction(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.pem"
    for _ in range(2):
        with pytest.raises(UsageError, match="cannot load the CA certificates"):
            tls_context(missing)
