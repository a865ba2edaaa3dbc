"""Customer identities and the Redis key layout (``outpost_core._keys``)."""

from __future__ import annotations

import re
import zlib
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outpost_core import ALL_CHANNELS, CONFIGURATION_KEY, Customer
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


def test_shard_is_crc32_of_the_tag_modulo_16() -> None:
    assert keys.SHARDS == 16
    for customer in (Customer("external", "c1"), Customer("customer", "c1")):
        assert customer.shard == zlib.crc32(customer.tag.encode()) % 16


@given(st.sampled_from(["external", "customer"]), st.text(min_size=1))
def test_shard_is_stable_and_in_range(kind: str, ident: str) -> None:
    customer = Customer(kind, ident)  # type: ignore[arg-type]
    assert 0 <= customer.shard < keys.SHARDS
    assert Customer(kind, ident).shard == customer.shard  # type: ignore[arg-type]


def test_shards_spread_over_all_sixteen() -> None:
    seen = {Customer("external", f"c{i}").shard for i in range(400)}
    assert seen == set(range(16))


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
    shard = customer.shard
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
    assert keys.all_channels() == ALL_CHANNELS
    assert set(keys.all_channels("db1")).isdisjoint(ALL_CHANNELS)


def test_channel_and_outbox_naming() -> None:
    assert keys.channel(3) == "outpost:v2:{3}:changes"
    assert keys.outbox_key(3) == "outpost:v2:{3}:outbox"
    assert tuple(f"outpost:v2:{{{s}}}:changes" for s in range(16)) == ALL_CHANNELS
    assert tuple(f"outpost:v2:{{{s}}}:outbox" for s in range(16)) == keys.ALL_OUTBOXES


def _hash_tag(key: str) -> str:
    """The part of a key Redis Cluster hashes: between the first '{' and the next '}'."""
    start = key.index("{")
    return key[start + 1 : key.index("}", start + 1)]


def test_every_key_of_a_customer_shares_the_hash_tag() -> None:
    for ident in AWKWARD:
        customer = Customer("external", ident)
        tag = str(customer.shard)
        state = keys.state_key(customer, "{r}")
        for key in (
            state,
            keys.bucket_key(state, 300_000_000),
            keys.acked_key(state),
            keys.channel(customer.shard),
            keys.outbox_key(customer.shard),
        ):
            assert _hash_tag(key) == tag


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
