"""The adaptive per-prefix request-rate shaper: its arithmetic on a fake clock, its pacing on a
real one, and a store shaping its requests against a throttling proxy."""

from __future__ import annotations

import asyncio
import random

import pytest

from stoker.storage import StorageOptions, open_store, shaping
from stoker.storage.engine import IOEngine
from stoker.storage.shaping import PrefixShaper, Shapers, ShapingPolicy, prefix_of
from stoker.testing.netproxy import NetProxy, RateLimitConfig


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def shaper(clock: FakeClock, **policy: float | bool) -> PrefixShaper:
    return PrefixShaper(
        policy=ShapingPolicy(**policy),  # type: ignore[arg-type]  # test keywords
        clock=clock,
        rng=random.Random(0),
    )


@pytest.mark.parametrize(
    ("root", "key", "expected"),
    [
        ("datasets/imagenet", "train/shard-0001.tar", "datasets/imagenet/train"),
        ("datasets/imagenet", "index.json", "datasets/imagenet"),
        ("", "train/a/b.jpg", "train"),
        ("", "top.txt", ""),
        ("/dl/", "/obj-1", "dl"),
    ],
)
def test_prefix_is_the_root_and_the_keys_first_directory(
    root: str, key: str, expected: str
) -> None:
    assert prefix_of(root, key) == expected


def test_unbounded_until_the_first_throttle() -> None:
    clock = FakeClock()
    s = shaper(clock)
    for _ in range(100):
        s.succeeded()
    assert s.rate is None
    assert asyncio.run(s.acquire()) == (clock.now, 0.0)


def test_first_throttle_starts_below_the_admitted_rate_and_counts_one_burst_once() -> None:
    clock = FakeClock()
    s = shaper(clock)
    sent = clock.now
    for _ in range(200):  # 200 admitted over one second
        clock.now += 0.005
        s.succeeded()
    s.throttled(sent)
    assert s.rate == pytest.approx(0.7 * 200)
    # More throttles of requests sent before the decrease: counted, no further decrease.
    for _ in range(50):
        s.throttled(sent)
    assert s.throttles == 51
    assert s.rate == pytest.approx(140)
    # A request sent after it, throttled too: the rate was still too high.
    clock.now += 0.01
    s.throttled(clock.now)
    assert s.rate == pytest.approx(0.7 * 140)


def test_rate_recovers_additively_then_probes() -> None:
    clock = FakeClock()
    s = shaper(clock, recovery_s=2.0)
    for _ in range(100):
        clock.now += 0.01
        s.succeeded()
    s.throttled(clock.now)  # first throttle: slow start from here
    s._slow_start = False  # look at the additive phase alone
    s._rate, s._last_throttled_rate, s._increase_per_s = 70.0, 100.0, 15.0
    for _ in range(100):  # 100 req/s admitted for a second: the rate may grow
        clock.now += 0.01
        s.succeeded()
    assert s.rate == pytest.approx(85.0, abs=0.5)
    for _ in range(100):
        clock.now += 0.01
        s.succeeded()
    # Back at the rate it was throttled at, without a throttle since: it probes faster.
    rate = s.rate
    assert rate is not None
    assert rate >= 100.0
    assert s._slow_start


def test_rate_does_not_inflate_past_twice_what_is_used() -> None:
    clock = FakeClock()
    s = shaper(clock)
    for _ in range(50):
        clock.now += 0.02
        s.succeeded()
    s.throttled(clock.now - 0.5)
    for _ in range(20):  # then one request every 0.1 s: 10/s used
        clock.now += 0.1
        s.succeeded()
    rate = s.rate
    assert rate is not None
    assert rate > 2 * 10
    for _ in range(600):  # for a minute: the rate neither grows nor falls
        clock.now += 0.1
        s.succeeded()
    assert s.rate == rate


def test_decrease_never_goes_below_the_floor() -> None:
    clock = FakeClock()
    s = shaper(clock, min_requests_per_s=5.0)
    for _ in range(20):
        clock.now += 0.1
        s.throttled(clock.now)
    assert s.rate == 5.0


def test_non_adaptive_policy_counts_throttles_and_keeps_the_cap() -> None:
    clock = FakeClock()
    s = shaper(clock, adaptive=False)
    s.cap = 50.0
    s.succeeded()
    s.throttled(clock.now)
    assert (s.throttles, s.rate) == (1, 50.0)
    assert s._window is None  # no slow start of the requests in flight either


def test_a_cap_paces_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    s = PrefixShaper(policy=ShapingPolicy(), cap=200.0, clock=clock, rng=random.Random(0))

    async def sleep(seconds: float) -> None:  # the shaper's waits move the fake clock
        clock.now += max(seconds, 1e-9)  # as a real sleep does, however short

    monkeypatch.setattr(shaping.asyncio, "sleep", sleep)

    async def take(n: int) -> list[float]:
        waited = []
        for _ in range(n):
            waited.append((await s.acquire())[1])
            s.release()
        return waited

    start = clock.now
    waited = asyncio.run(take(41))
    # The first request goes at once; each of the other 40 waits for its token at 200/s.
    assert waited[0] == 0.0
    assert clock.now - start == pytest.approx(40 / 200, abs=1e-6)
    assert sum(waited) == pytest.approx(40 / 200, abs=1e-6)
    assert s.waits == 40


def test_requests_in_flight_start_in_a_window_that_grows_with_each_success() -> None:
    s = PrefixShaper(policy=ShapingPolicy())

    async def run() -> None:
        for _ in range(8):  # the initial window
            await s.acquire()
        ninth = asyncio.ensure_future(s.acquire())
        await asyncio.sleep(0.01)
        assert not ninth.done()
        s.succeeded()  # the window grows by one: the ninth goes
        await asyncio.wait_for(ninth, 1.0)
        tenth, eleventh = (asyncio.ensure_future(s.acquire()) for _ in range(2))
        await asyncio.sleep(0.01)
        assert not tenth.done()
        s.release()  # one done without success: its place goes to the next
        await asyncio.wait_for(tenth, 1.0)
        assert not eleventh.done()
        s.throttled(0.0)  # the first throttle: the rate governs, the window goes
        await asyncio.wait_for(eleventh, 1.0)

    asyncio.run(run())


def test_a_cancelled_waiter_passes_its_place_on() -> None:
    s = PrefixShaper(policy=ShapingPolicy())

    async def run() -> None:
        for _ in range(8):
            await s.acquire()
        first, second = (asyncio.ensure_future(s.acquire()) for _ in range(2))
        await asyncio.sleep(0.01)
        s.release()  # wakes the first, which is cancelled before it runs
        first.cancel()
        await asyncio.wait_for(second, 1.0)

    asyncio.run(run())


def test_shapers_are_shared_per_key_and_take_the_lowest_cap() -> None:
    shapers = Shapers()
    policy = ShapingPolicy()
    a = shapers.get(("e", "b", "p"), policy=policy, cap=None)
    assert shapers.get(("e", "b", "p"), policy=policy, cap=100.0) is a
    assert shapers.get(("e", "b", "p"), policy=policy, cap=300.0).cap == 100.0
    assert shapers.get(("e", "b", "q"), policy=policy, cap=None) is not a
    assert shapers.snapshot()[("e", "b", "p")] == (0, 100.0)


def test_policy_and_options_are_checked() -> None:
    with pytest.raises(ValueError, match="decrease_factor"):
        ShapingPolicy(decrease_factor=1.0)
    with pytest.raises(ValueError, match="recovery_s"):
        ShapingPolicy(recovery_s=0)
    with pytest.raises(ValueError, match="max_requests_per_s"):
        StorageOptions(max_requests_per_s=0)
    options = StorageOptions.from_mapping(
        {"max_requests_per_s": 10, "shaping": {"decrease_factor": 0.5}}
    )
    assert options.max_requests_per_s == 10
    assert options.shaping == ShapingPolicy(decrease_factor=0.5)


@pytest.mark.slow
def test_store_shapes_its_requests_under_a_throttling_proxy(s3_bucket, s3_server) -> None:
    """Many concurrent GETs of one prefix through a 100 req/s limit: the store learns the
    rate, its counters show the throttles and the rate, and few requests are wasted."""
    writer = s3_bucket.store("p")
    for i in range(20):
        writer.put(f"k{i}", b"x" * 100)
    engine = IOEngine()
    try:
        with NetProxy(
            "127.0.0.1", s3_server.port, rate_limit=RateLimitConfig(requests_per_s=100)
        ) as proxy:
            url, options = f"{s3_bucket.url}/p", s3_bucket.options(proxy.endpoint)
            store = open_store(url, storage_options=options, engine=engine)
            twin = open_store(url, storage_options=options, engine=engine)

            async def read_all() -> None:
                sem = asyncio.Semaphore(32)

                async def one(i: int) -> None:
                    async with sem:
                        assert bytes(await store.get_async(f"k{i % 20}")) == b"x" * 100

                await asyncio.gather(*(one(i) for i in range(400)))

            engine.run(read_all())
            stats = proxy.stats()
            assert twin.get("k0") == b"x" * 100
        counters = store.counters.snapshot()
        assert counters["throttles"] == counters["errors.throttle"] > 0
        assert 1 <= counters["shaping.rate_per_s"] <= 200
        assert counters["shaping.waits"] > 0
        assert stats.throttled < 0.25 * stats.requests
        # One shaper for the prefix, shared by every store on the engine.
        (key, (throttles, rate)), *others = engine.shapers.snapshot().items()
        assert not others
        assert key[1:] == (s3_bucket.name, "p")
        assert throttles == counters["throttles"]
        assert rate is not None
    finally:
        engine.close()
