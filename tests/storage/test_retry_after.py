"""A server's Retry-After reaches the retry loop where stoker sees the response: the raw
listing's own requests (obstore's errors carry no response headers; see storage/retry.py)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from stoker.storage.rawlist import RawLister
from stoker.storage.retry import classify, retry_after_s

_SLOW_DOWN = (
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
)


class _Throttling(http.server.BaseHTTPRequestHandler):
    retry_after = "7"

    def do_GET(self) -> None:
        self.send_response(503)
        if self.retry_after:
            self.send_header("Retry-After", self.retry_after)
        self.send_header("Content-Length", str(len(_SLOW_DOWN)))
        self.end_headers()
        self.wfile.write(_SLOW_DOWN)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Throttling)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _lister(endpoint: str) -> RawLister:
    return RawLister(
        endpoint=endpoint,
        bucket="bucket",
        region="us-east-1",
        access_key_id="test-key",
        secret_access_key="test-secret",
        session_token=None,
        virtual_hosted=False,
        verify_ssl=True,
        timeout_s=10.0,
    )


@pytest.mark.parametrize(("header", "expected"), [("7", 7.0), ("0.5", 0.5), ("", None)])
def test_the_raw_listing_s_throttle_carries_the_server_s_retry_after(
    endpoint: str, header: str, expected: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Throttling, "retry_after", header)
    with pytest.raises(OSError, match="status code: 503") as info:
        _lister(endpoint).page("p/", start_after=None, delimiter=False)
    assert classify(info.value) == "throttle"
    assert retry_after_s(info.value) == expected
