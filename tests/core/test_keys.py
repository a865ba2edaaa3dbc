"""Customer identities and the Redis key layout (``outpost_core._keys``)."""

from __future__ import annotations

import re
import zlib
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outpost_core import CONFIGURATION_KEY, Customer
from outpost_core import _keys as keys

AWKWARD = [
    "a:b",
    "a",
    "b",
    "a:b:c",
    "{a}",
    "a}{",
    "{",
    "}",
    "a b",
    "a%20b",
    "a%3Ab",
    "%",
    "%%",
    "ünïcödé ✓ 客户",
    "emoji 🙂",
    "tab\there",
    "new\nline",
    "nbsp\u00a0x",
    "zero\u200bwidth",
    "nul\x00x",
    "x" * 10_000,
    "x" * 10_001,
]


def test_prefix_and_configuration_key_carry_the_layout_version() -> None:
    assert keys.VERSION == 2
    assert keys.PREFIX == "outpost:v2:"
    assert CONFIGURATION_KEY == "outpost:v2:configuration"


def test_customer_tag_wire_and_str() -> None:
    ext = Customer("external", "c1")
    cus = Customer("customer", "9f0c0000-0000-4000-8000-000000000000")
    assert ext.tag == "external:c1" == str(ext)
    assert cus.tag == "customer:9f0c0000-0000-4000-8000-000000000000" == str(cus)
    assert ext.wire() == {"external_customer_id": "c1"}
    assert cus.wire() == {"customer_id": "9f0c0000-0000-4000-8000-000000000000"}


def test_shards_as_the_conformance_readme_s_examples() -> None:
    examples = [Customer("external", i) for i in ("c1", "acme:{eu} 1", "c:2 {x}", "c2")]
    assert [keys.shard_of(c) for c in examples] == [10, 2, 7, 0]
    assert [keys.shard_of(c, 64) for c in examples] == [10, 50, 7, 48]
    assert [keys.shard_of(c, 1024) for c in examples] == [906, 306, 839, 560]


def test_shard_is_crc32_of_the_tag_modulo_the_count_16_by_default() -> None:
    assert keys.DEFAULT_SHARDS == 16
    for customer in (Customer("external", "c1"), Customer("customer", "c1")):
        assert keys.shard_of(customer) == zlib.crc32(customer.tag.encode()) % 16
        for count in (1, 7, 64, keys.MAX_SHARDS):
            assert keys.shard_of(customer, count) == zlib.crc32(customer.tag.encode()) % count


@given(
    st.sampled_from(["external", "customer"]),
    st.text(min_size=1),
    st.integers(min_value=1, max_value=keys.MAX_SHARDS),
)
def test_shard_is_stable_and_in_range(kind: str, ident: str, count: int) -> None:
    customer = Customer(kind, ident)  # type: ignore[arg-type]
    assert 0 <= keys.shard_of(customer, count) < count
    assert keys.shard_of(Customer(kind, ident), count) == keys.shard_of(customer, count)  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [16, 64])
def test_shards_spread_over_all_of_them(count: int) -> None:
    seen = {keys.shard_of(Customer("external", f"c{i}"), count) for i in range(40 * count)}
    assert seen == set(range(count))


def test_a_customer_keeps_its_keys_under_a_multiple_of_16_only_when_its_shard_is_below_16() -> None:
    # What a move from 16 to 64 shards keeps (docs/redis-layout.md): the keys of shards 0..15.
    for i in range(500):
        customer = Customer("external", f"c{i}")
        wide = keys.state_key(customer, "r", 64)
        same = wide == keys.state_key(customer, "r")
        assert same == (keys.shard_of(customer, 64) < 16)
        assert wide == f"outpost:v2:{{{keys.shard_of(customer, 64)}}}:external:c{i}:r"


@pytest.mark.parametrize(
    ("text", "encoded"),
    [
        ("plain-id_1.x", "plain-id_1.x"),
        ("a:b", "a%3Ab"),
        ("{a}", "%7Ba%7D"),
        ("a b", "a%20b"),
        ("100%", "100%25"),
        ("tab\t", "tab%09"),
        ("nbsp\u00a0", "nbsp%C2%A0"),
        ("nul\x00", "nul%00"),
        ("ünï ✓", "ünï%20✓"),
        ("", ""),
    ],
)
def test_encode_component_escapes_only_what_could_break_a_key(text: str, encoded: str) -> None:
    assert keys.encode_component(text) == encoded


@given(st.lists(st.text(), unique=True, max_size=20))
def test_encode_component_is_injective(texts: list[str]) -> None:
    encoded = [keys.encode_component(text) for text in texts]
    assert len(set(encoded)) == len(texts)


@given(st.text())
def test_encode_component_is_reversible(text: str) -> None:
    # Percent-decoding gives the text back, which proves no two texts share an encoding.
    assert unquote(keys.encode_component(text), errors="strict") == text


@given(st.text())
def test_encode_component_leaves_no_separator_brace_or_whitespace(text: str) -> None:
    encoded = keys.encode_component(text)
    assert not re.search(r"[:{}\s]", encoded)
    assert all(char.isprintable() for char in encoded)
    # Every '%' starts an escape, which is what makes the encoding reversible.
    assert re.fullmatch(r"(?:[^%]|%[0-9A-F]{2})*", encoded)


def test_state_key_layout() -> None:
    customer = Customer("external", "a:b")
    shard = keys.shard_of(customer)
    state = keys.state_key(customer, "r:1")
    assert state == f"outpost:v2:{{{shard}}}:external:a%3Ab:r%3A1"
    assert keys.customer_prefix(customer) == f"outpost:v2:{{{shard}}}:external:a%3Ab"
    assert keys.bucket_key(state, 300_000_000) == state + ":ev:300000000"
    assert keys.bucket_key(state, "300000000") == state + ":ev:300000000"
    assert keys.acked_key(state) == state + ":acked"
    assert keys.tag_of(shard) == f"outpost:v2:{{{shard}}}:"


def test_channels_of_numbered_databases_are_their_own() -> None:
    assert keys.namespace_of_database(0) == ""
    assert keys.namespace_of_database(5) == "db5"
    assert keys.channel(3, "db5") == "outpost:v2:{3}:changes:db5"
    assert keys.all_channels("db5")[3] == "outpost:v2:{3}:changes:db5"
    assert keys.all_channels() == keys.all_channels("", 16)
    assert set(keys.all_channels("db1")).isdisjoint(keys.all_channels())
    assert keys.shard_of_channel("db5", 64)["outpost:v2:{40}:changes:db5"] == 40
    assert "outpost:v2:{40}:changes" not in keys.shard_of_channel("", 16)


def test_channel_and_outbox_naming() -> None:
    assert keys.channel(3) == "outpost:v2:{3}:changes"
    assert keys.outbox_key(3) == "outpost:v2:{3}:outbox"
    assert tuple(f"outpost:v2:{{{s}}}:changes" for s in range(16)) == keys.all_channels()
    assert tuple(f"outpost:v2:{{{s}}}:outbox" for s in range(16)) == keys.all_outboxes()
    assert tuple(f"outpost:v2:{{{s}}}:outbox" for s in range(64)) == keys.all_outboxes(64)
    assert keys.shard_of_stream(64)["outpost:v2:{63}:outbox"] == 63
    assert keys.tag_of(keys.MAX_SHARDS - 1) == f"outpost:v2:{{{keys.MAX_SHARDS - 1}}}:"
    assert keys.SHARDS_KEY == "outpost:v2:{fleet}:shards"


def _hash_tag(key: str) -> str:
    """The part of a key Redis Cluster hashes: between the first '{' and the next '}'."""
    start = key.index("{")
    return key[start + 1 : key.index("}", start + 1)]


def test_every_key_of_a_customer_shares_the_hash_tag() -> None:
    for ident in AWKWARD:
        customer = Customer("external", ident)
        for count in (16, 64):
            shard = keys.shard_of(customer, count)
            state = keys.state_key(customer, "{r}", count)
            for key in (
                state,
                keys.bucket_key(state, 300_000_000),
                keys.acked_key(state),
                keys.channel(shard),
                keys.outbox_key(shard),
            ):
                assert _hash_tag(key) == str(shard)


def test_keys_of_awkward_ids_are_distinct() -> None:
    customers = [Customer(kind, i) for i in AWKWARD for kind in ("external", "customer")]
    states = [keys.state_key(c, r) for c in customers for r in ("r1", "r:1", "r1:ev")]
    everything = (
        states + [keys.bucket_key(s, 0) for s in states] + [keys.acked_key(s) for s in states]
    )
    assert len(set(everything)) == len(everything)
    for key in everything:
        assert not re.search(r"\s", key)


@given(st.text(min_size=1), st.text(min_size=1), st.text(min_size=1), st.text(min_size=1))
def test_state_keys_collide_only_for_the_same_identity(a: str, ra: str, b: str, rb: str) -> None:
    ka = keys.state_key(Customer("external", a), ra)
    kb = keys.state_key(Customer("external", b), rb)
    assert (ka == kb) == ((a, ra) == (b, rb))
    assert keys.bucket_key(ka, 0) != kb and keys.acked_key(ka) != kb
