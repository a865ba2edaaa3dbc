"""The sync driver tests are built on demand: once per change of their source, never left stale."""

from __future__ import annotations

from pathlib import Path

from scripts.unasync import build_sync_tests, check_driver, write_driver

SOURCE = """from outpost_async import AsyncOutpost


async def test_reads(async_instance: AsyncOutpost) -> None:
    await async_instance.flush()
"""


def test_builds_the_sync_twin_then_leaves_it_until_its_source_changes(tmp_path: Path) -> None:
    source_dir, target_dir = tmp_path / "_async", tmp_path / "_sync"
    source_dir.mkdir()
    target_dir.mkdir()
    (source_dir / "test_x.py").write_text(SOURCE)
    (source_dir / "__init__.py").write_text("")
    build_sync_tests(source_dir, target_dir)
    twin = target_dir / "test_x.py"
    text = twin.read_text()
    assert text.startswith("# GENERATED from test_x.py")
    assert "def test_reads(sync_instance: Outpost) -> None:\n    sync_instance.flush()" in text
    assert not (target_dir / "__init__.py").exists()  # hand-written twins are not built

    twin.write_text(text.splitlines(keepends=True)[0] + "edited by hand\n")
    build_sync_tests(source_dir, target_dir)
    assert twin.read_text().endswith("edited by hand\n")  # its digest matched: not rebuilt

    (source_dir / "test_x.py").write_text(SOURCE.replace("flush", "close"))
    build_sync_tests(source_dir, target_dir)
    assert "sync_instance.close()" in twin.read_text()

    (source_dir / "test_x.py").unlink()
    build_sync_tests(source_dir, target_dir)
    assert not twin.exists()  # its source is gone
    assert list(target_dir.iterdir()) == []


def test_the_committed_sync_driver_matches_its_source() -> None:
    assert check_driver() == []


def test_the_whole_sync_package_is_generated_but_its_hand_written_modules(tmp_path: Path) -> None:
    source_dir, target_dir = tmp_path / "outpost_async", tmp_path / "outpost_sync"
    source_dir.mkdir()
    target_dir.mkdir()
    (source_dir / "_loop.py").write_text("async def run() -> None:\n    pass\n")
    (source_dir / "_worker.py").write_text("from outpost_async._loop import run\n\nSTART = run\n")
    (source_dir / "_backend.py").write_text("async def own() -> None:\n    pass\n")
    (target_dir / "_backend.py").write_text("def own() -> None:\n    pass\n")
    (target_dir / "_gone.py").write_text("# GENERATED from outpost_async/_gone.py by hand\n")
    assert check_driver(source_dir, target_dir) == [
        str(target_dir / "_loop.py"),  # missing
        str(target_dir / "_worker.py"),
        str(target_dir / "_gone.py"),  # its source is gone
    ]

    write_driver(source_dir, target_dir)
    assert check_driver(source_dir, target_dir) == []
    assert sorted(p.name for p in target_dir.iterdir()) == ["_backend.py", "_loop.py", "_worker.py"]
    assert "def run() -> None:" in (target_dir / "_loop.py").read_text()
    assert "from outpost_sync._loop import run" in (target_dir / "_worker.py").read_text()
    assert (target_dir / "_backend.py").read_text() == "def own() -> None:\n    pass\n"

    worker = target_dir / "_worker.py"
    worker.write_text(worker.read_text() + "# edited by hand\n")  # only the end differs
    assert check_driver(source_dir, target_dir) == [str(worker)]
