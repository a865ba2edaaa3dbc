"""Connection options: the argument, else the environment, else the default."""

from __future__ import annotations

from outpost_core import (
    DEFAULT_REDIS_URL,
    DEFAULT_SERVER_URL,
    ConnectionOptions,
    DeliverySettings,
    cluster_node_url,
)

ENVIRONMENT = {
    "POLAR_ACCESS_TOKEN": "polar_oat_env",
    "POLAR_SERVER_URL": "https://sandbox-api.polar.sh",
    "REDIS_URL": "redis://cache:6379/2",
}


def test_nothing_given_nothing_set_takes_the_defaults() -> None:
    resolved = ConnectionOptions.resolve({})
    assert resolved == ConnectionOptions(
        access_token=None,
        redis_url=DEFAULT_REDIS_URL,
        server_url=DEFAULT_SERVER_URL,
        telemetry=True,
        telemetry_url=DEFAULT_SERVER_URL,
    )


def test_the_environment_fills_what_the_caller_left_out() -> None:
    resolved = ConnectionOptions.resolve(ENVIRONMENT)
    assert resolved.access_token == "polar_oat_env"
    assert resolved.redis_url == "redis://cache:6379/2"
    assert resolved.server_url == resolved.telemetry_url == "https://sandbox-api.polar.sh"


def test_arguments_win_over_the_environment() -> None:
    resolved = ConnectionOptions.resolve(
        ENVIRONMENT,
        access_token="polar_oat_arg",
        redis_url="redis://other:6379/0",
        server_url="http://127.0.0.1:8000",
        telemetry_url="http://relay:4318",
    )
    assert (resolved.access_token, resolved.redis_url) == ("polar_oat_arg", "redis://other:6379/0")
    assert (resolved.server_url, resolved.telemetry_url) == (
        "http://127.0.0.1:8000",
        "http://relay:4318",
    )


def test_empty_values_count_as_unset() -> None:
    empty = {name: "" for name in ENVIRONMENT}
    resolved = ConnectionOptions.resolve(empty, access_token="", redis_url="", server_url="")
    assert resolved.access_token is None
    assert (resolved.redis_url, resolved.server_url) == (DEFAULT_REDIS_URL, DEFAULT_SERVER_URL)


def test_telemetry_is_off_when_either_the_argument_or_the_variable_says_so() -> None:
    assert not ConnectionOptions.resolve({}, telemetry=False).telemetry
    assert not ConnectionOptions.resolve({"POLAR_OUTPOST_TELEMETRY": "0"}).telemetry
    assert ConnectionOptions.resolve({"POLAR_OUTPOST_TELEMETRY": "1"}).telemetry
    assert not ConnectionOptions.resolve(
        {"POLAR_OUTPOST_TELEMETRY": "1"}, telemetry=False
    ).telemetry


def test_stale_entries_are_looked_for_twice_per_claim_idle_at_most_every_30_s() -> None:
    assert DeliverySettings().claim_interval == 30.0
    assert DeliverySettings(claim_idle=10.0).claim_interval == 5.0
    assert DeliverySettings(claim_idle=10.0, claim_interval=1.0).claim_interval == 1.0


def test_a_cluster_url_names_one_of_its_nodes() -> None:
    assert cluster_node_url("redis+cluster://10.0.0.1:7000") == "redis://10.0.0.1:7000"
    assert cluster_node_url("rediss+cluster://u:p@h:7000/0") == "rediss://u:p@h:7000/0"
    assert cluster_node_url("redis://127.0.0.1:6379/0") is None
    assert cluster_node_url("not a url+cluster") is None
