"""Failures against the real S3 server: faults through the proxy, bad credentials, missing
buckets, unreachable endpoints."""

from __future__ import annotations

import pytest

from stoker.errors import CredentialsError, EndpointError, ObjectNotFoundError
from stoker.storage import open_store
from stoker.storage.transfer import upload
from stoker.testing.netproxy import FAULT_KINDS, FaultConfig, NetProxy
from stoker.testing.seaweed import SECRET_KEY, free_ports

FAST_RETRY = {"base_delay_s": 0.001, "max_delay_s": 0.01}


def test_throttling_and_server_errors_are_retried(s3_bucket, proxy: NetProxy) -> None:
    direct = s3_bucket.store()
    for i in range(40):
        direct.put(f"obj/{i}", f"value {i}".encode())
    proxy.set_faults(
        FaultConfig(fault_rate=0.3, kinds=("503", "500"), seed=3, fault_methods=frozenset({"GET"}))
    )
    store = s3_bucket.store(endpoint=proxy.endpoint, retry=FAST_RETRY)
    for i in range(40):
        assert bytes(store.get(f"obj/{i}")) == f"value {i}".encode()
    stats = proxy.stats()
    counters = store.counters.snapshot()
    assert stats.faulted > 0
    assert counters["retries"] == stats.faulted
    assert counters.get("throttles", 0) == stats.faults.get("503", 0)
    assert counters.get("errors.server", 0) == stats.faults.get("500", 0)


def test_connection_resets_are_retried(s3_bucket, proxy: NetProxy) -> None:
    direct = s3_bucket.store()
    direct.put("reset-me", b"x" * 5000)
    proxy.set_faults(FaultConfig(fault_rate=0.5, kinds=("reset",), seed=1))
    store = s3_bucket.store(endpoint=proxy.endpoint, retry=FAST_RETRY)
    for _ in range(20):
        assert bytes(store.get("reset-me")) == b"x" * 5000
    assert proxy.stats().faulted > 0
    assert store.counters.get("retries") >= proxy.stats().faulted
    assert store.counters.get("errors.reset") + store.counters.get("errors.connect") > 0


def test_retries_give_up_with_a_clear_error(s3_bucket, proxy: NetProxy) -> None:
    s3_bucket.store().put("always-503", b"x")
    proxy.set_faults(FaultConfig(fault_rate=1.0, kinds=("503",)))
    store = s3_bucket.store(endpoint=proxy.endpoint, retry={**FAST_RETRY, "max_attempts": 3})
    with pytest.raises(Exception, match="always-503") as info:
        store.get("always-503")
    assert "gave up" in str(info.value)
    # The XML body's code and message, not obstore's first line (which ends at "<?xml ...?>").
    assert "HTTP 503" in str(info.value)
    assert "SlowDown" in str(info.value)
    assert "<?xml" not in str(info.value)
    assert store.counters.get("retries") == 2


def test_bad_credentials_name_their_source_not_their_value(s3_bucket) -> None:
    canary = "CANARY-secret-value-0123456789"
    store = s3_bucket.store(secret_access_key=canary)
    with pytest.raises(CredentialsError) as info:
        store.get("anything")
    message = str(info.value)
    assert "storage_options" in message
    assert canary not in message
    assert canary not in repr(store)
    assert SECRET_KEY not in message


def test_missing_bucket_is_named(s3_server) -> None:
    store = open_store("s3://no-such-bucket-here", storage_options=s3_server.storage_options())
    with pytest.raises(ObjectNotFoundError, match="bucket 'no-such-bucket-here' does not exist"):
        store.get("k")
    with pytest.raises(FileNotFoundError, match="no-such-bucket-here"):
        list(store.list())


def test_unreachable_endpoint_is_named(s3_server) -> None:
    (port,) = free_ports(1)
    endpoint = f"http://127.0.0.1:{port}"
    options = {**s3_server.storage_options(endpoint), "retry": FAST_RETRY}
    store = open_store("s3://bucket", storage_options=options)
    with pytest.raises(EndpointError, match=f"127.0.0.1:{port}"):
        store.get("k")
    with pytest.raises(ConnectionError):
        store.head("k")


@pytest.mark.parametrize(
    ("kind", "error"), [("truncate", "reset"), ("body_reset", "reset"), ("stall", "timeout")]
)
def test_spoiled_responses_are_retried(s3_bucket, proxy: NetProxy, kind: str, error: str) -> None:
    """Responses cut short (clean close or reset) or stalled past the timeout, on every
    kind of request: each costs exactly one retry, and no short data reaches the caller."""
    direct = s3_bucket.store()
    big = bytes(range(256)) * 4096  # 1 MiB
    for i in range(3):
        direct.put(f"obj/{i}", big[: 50_000 + i])
    proxy.set_faults(FaultConfig(fault_rate=0.3, kinds=(kind,), seed=4))
    # A stall ends with the client's timeout; 0.3 s keeps the test short.
    store = s3_bucket.store(endpoint=proxy.endpoint, retry=FAST_RETRY, timeout_s=0.3)
    for i in range(3):
        assert bytes(store.get(f"obj/{i}")) == big[: 50_000 + i]
        assert bytes(store.get_range(f"obj/{i}", start=100, end=40_000)) == big[100:40_000]
        assert store.head(f"obj/{i}").size == 50_000 + i
    store.put("written", big)
    assert sorted(m.key for m in store.list("obj")) == [f"obj/{i}" for i in range(3)]
    assert bytes(direct.get("written")) == big
    stats = proxy.stats()
    counters = store.counters.snapshot()
    assert stats.faults[kind] > 0
    assert counters["retries"] == stats.faults[kind] == counters[f"errors.{error}"]


def test_a_stalled_request_times_out_with_a_clear_error(s3_bucket, proxy: NetProxy) -> None:
    s3_bucket.store().put("slow", b"x" * 10_000)
    proxy.set_faults(FaultConfig(fault_rate=1.0, kinds=("stall",)))
    store = s3_bucket.store(
        endpoint=proxy.endpoint, retry={**FAST_RETRY, "max_attempts": 2}, timeout_s=0.3
    )
    with pytest.raises(EndpointError, match=r"slow: no complete response .* timeout_s=0\.3"):
        store.get("slow")
    assert store.counters.get("errors.timeout") == 2


def test_a_long_listing_survives_faults_on_its_pages(s3_bucket, proxy, tmp_path) -> None:
    """Every page of a 3-page listing may fail (any kind): a failed page is asked again
    from the last key delivered, so each key comes exactly once, in order."""
    (tmp_path / "src").mkdir()
    names = [f"k{i:05d}" for i in range(2300)]
    for name in names:
        (tmp_path / "src" / name).write_bytes(b"")
    upload(tmp_path / "src", s3_bucket.store("many"))
    proxy.set_faults(
        FaultConfig(fault_rate=0.5, kinds=FAULT_KINDS, seed=2, fault_paths="list-type=2")
    )
    store = s3_bucket.store("many", endpoint=proxy.endpoint, retry=FAST_RETRY, timeout_s=0.5)
    assert [m.key for m in store.list()] == names
    assert proxy.stats().faulted > 0
    assert store.counters.get("retries") == proxy.stats().faulted
