"""What the reliability tests share: the fault mix, a patient-but-quick client, checks."""

from __future__ import annotations

from typing import Any

import pytest

from stoker.testing.netproxy import FAULT_KINDS, FaultConfig, NetProxy

#: 5% of requests faulted, every kind in the mix: 503 SlowDown, 500, reset before the
#: response, reset mid-body, truncated body, stalled response.
FAULTS = FaultConfig(fault_rate=0.05, kinds=FAULT_KINDS, seed=2024)

#: Retries come quickly, and a stall costs one short timeout, so the tests take seconds.
#: A whole request (a 1 MB range at most here) needs far less than TIMEOUT_S on loopback.
RETRY = {"base_delay_s": 0.005, "max_delay_s": 0.05, "throttle_base_delay_s": 0.02}
TIMEOUT_S = 1.0


def faulty_options(bucket: Any, proxy: NetProxy, faults: FaultConfig = FAULTS) -> dict[str, Any]:
    """Storage options that reach the bucket through the proxy, which now injects faults."""
    proxy.set_faults(faults)
    return bucket.options(proxy.endpoint, retry=RETRY, timeout_s=TIMEOUT_S)


def retries_logged(caplog: pytest.LogCaptureFixture) -> int:
    """Retries made, from the retry layer's debug line per retry (for runs whose stores are
    internal, like pack's); the test sets caplog to DEBUG for ``stoker.storage.retry``."""
    return sum(
        1
        for r in caplog.records
        if r.name == "stoker.storage.retry" and "retrying" in r.getMessage()
    )
