"""``outpost_core/_scripts.py`` is what ``scripts/gen_scripts.py`` makes of ``lua/*.lua`` today."""

from __future__ import annotations

import hashlib
from pathlib import Path

from outpost_core import SCRIPT_SHA1, SCRIPT_TEXT
from scripts import gen_scripts

ROOT = Path(__file__).resolve().parents[2]


def test_generated_module_is_fresh() -> None:
    wanted = gen_scripts.render(gen_scripts.compose())
    current = (ROOT / "outpost_core" / "_scripts.py").read_text(encoding="utf-8")
    assert current == wanted, "outpost_core/_scripts.py is stale: run python scripts/gen_scripts.py"


def test_every_script_is_lib_chunks_in_order_then_its_own_file() -> None:
    library = (ROOT / "lua" / "lib.lua").read_text(encoding="utf-8")
    chunks = library.rstrip("\n").split("\n\n")
    names = {p.stem for p in (ROOT / "lua").glob("*.lua")} - {"lib"}
    assert set(SCRIPT_TEXT) == names
    assert {"track", "acknowledge", "confirm", "apply_snapshot"} <= names
    for name, text in SCRIPT_TEXT.items():
        own = (ROOT / "lua" / f"{name}.lua").read_text(encoding="utf-8")
        head, _, rest = text.partition("\n\n" + own)
        assert rest == ""
        used = head.split("\n\n")
        assert used == [chunk for chunk in chunks if chunk in used]
        assert all(chunk in used for chunk in chunks if not gen_scripts.DEFINES.search(chunk))


def test_a_script_carries_the_lib_functions_it_calls_and_no_other() -> None:
    defined = {name: set(gen_scripts.DEFINES.findall(text)) for name, text in SCRIPT_TEXT.items()}
    assert defined["track"] == {"fmt", "next_rev", "agg_with", "touch", "record", "finish"}
    assert {"rebuild", "agg_add", "agg_encode", "event_value"} <= defined["apply_snapshot"]
    assert "settle_identities" not in defined["apply_snapshot"]
    assert defined["reclaim"] == set()


def test_a_script_naming_every_lib_function_carries_the_whole_lib() -> None:
    library = (ROOT / "lua" / "lib.lua").read_text(encoding="utf-8")
    own = "-- " + " ".join(gen_scripts.DEFINES.findall(library)) + "\n"
    assert gen_scripts.compose_script(library, own) == library + "\n" + own


def test_sha1s_name_the_texts() -> None:
    assert set(SCRIPT_SHA1) == set(SCRIPT_TEXT)
    for name, text in SCRIPT_TEXT.items():
        assert SCRIPT_SHA1[name] == hashlib.sha1(text.encode("utf-8")).hexdigest()
