"""A loopback S3 endpoint whose listings misbehave as scripted: tests of the listings.

`ListingServer` answers a ListObjectsV2 request that asks for URL-encoded keys (the fallback
listing of :mod:`stoker.storage.rawlist`) with the next of its scripted answers, and repeats
the last one for every request after (a server stuck in a loop stays stuck); a script may
also be a function of the request's number (1, 2, ...) and query, for a server that loops
without end. A listing request that does not ask for URL-encoded keys (obstore's own) gets
a page holding a key obstore refuses (``bait/../key``), so that a store pointed at the
server falls back to the raw listing at once; with ``bait=False`` it is answered from the
script too (obstore's own listing is what is tested). Every other request is answered 404.

An answer is a body and a status, sent at once or trickled one byte every ``trickle_s``
seconds. The server records the query of each scripted listing request, answers at most
``max_requests`` of them (then ``400`` with ``RequestCapReached``, so a client that loops
ends with an error rather than running forever), stops a trickle after ``trickle_for_s``,
and stops everything when closed.

`listing_page` writes a page body the way S3 writes one.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

__all__ = ["Answer", "ListingServer", "Script", "listing_page"]

_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def listing_page(
    keys: Sequence[str | tuple[str, str]],
    *,
    truncated: bool = False,
    token: str | None = None,
    prefixes: Sequence[str] = (),
    encoded: bool = True,
) -> bytes:
    """A ListObjectsV2 answer holding ``keys`` (a key, or a key and its ``Size`` text).

    Keys are URL-encoded as S3 encodes them for ``encoding-type=url`` (``encoded``); a key
    given as text with ``%`` escapes already in it is encoded again, so pass raw keys.
    """

    def text(key: str) -> str:
        return urllib.parse.quote_plus(key, safe="/") if encoded else key

    contents = "".join(
        f"<Contents><Key>{text(key)}</Key><LastModified>2024-01-01T00:00:00.000Z"
        f'</LastModified><ETag>"d41d8cd98f00b204e9800998ecf8427e"</ETag><Size>{size}</Size>'
        "<StorageClass>STANDARD</StorageClass></Contents>"
        for key, size in ((k, "1") if isinstance(k, str) else k for k in keys)
    )
    common = "".join(
        f"<CommonPrefixes><Prefix>{text(p)}</Prefix></CommonPrefixes>" for p in prefixes
    )
    next_token = f"<NextContinuationToken>{token}</NextContinuationToken>" if token else ""
    encoding = "<EncodingType>url</EncodingType>" if encoded else ""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{_NS}">'
        f"<Name>bucket</Name><KeyCount>{len(keys) + len(prefixes)}</KeyCount>"
        f"<MaxKeys>1000</MaxKeys><IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"
        f"{next_token}{encoding}{contents}{common}</ListBucketResult>"
    ).encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """One scripted answer to a listing request.

    Attributes:
        body: The response body.
        status: The HTTP status.
        trickle_s: Send the body one byte every this many seconds (its ``Content-Length``
            announced whole up front); None sends it at once.
    """

    body: bytes
    status: int = 200
    trickle_s: float | None = None


#: Scripted answers in order (the last repeats), or the answer to request N (from 1) with
#: its query.
Script = Sequence[Answer | bytes] | Callable[[int, dict[str, str]], Answer | bytes]

_BAIT = listing_page(["bait/../key"], encoded=False)  # obstore refuses a '..' segment
_CAPPED = (
    b"<Error><Code>RequestCapReached</Code><Message>test server: no more answers</Message></Error>"
)


class ListingServer:
    """A loopback HTTP server answering listings with scripted pages (see the module).

    Use it as a context manager; ``endpoint`` is its URL. ``answers`` may be replaced
    between requests with :meth:`script`.

    Args:
        answers: Answers to the fallback listing's requests (:data:`Script`).
        max_requests: Most listing requests answered from the script.
        trickle_for_s: A trickled answer stops (the connection is closed) after this long.
        bait: Answer obstore's own listing requests with a key obstore refuses; False
            answers them from the script too.
    """

    def __init__(
        self,
        answers: Script,
        *,
        max_requests: int = 200,
        trickle_for_s: float = 30.0,
        bait: bool = True,
    ) -> None:
        self.max_requests = max_requests
        self.trickle_for_s = trickle_for_s
        self.bait = bait
        self.queries: list[dict[str, str]] = []  # each scripted listing request's query
        self._lock = threading.Lock()
        self._answers: Script = ()
        self._stopping = threading.Event()
        self.script(answers)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Head and body go in two writes: without this, a delayed ACK holds the body.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:  # the name http.server calls
                server._serve(self)

            def do_HEAD(self) -> None:
                self._not_found()

            do_PUT = do_DELETE = do_POST = do_HEAD

            def _not_found(self) -> None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.05,), daemon=True)

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def script(self, answers: Script) -> None:
        """Replace the scripted answers and forget the requests seen."""
        if not callable(answers) and not answers:
            raise ValueError("a ListingServer needs at least one answer")
        with self._lock:
            self._answers = answers if callable(answers) else list(answers)
            self.queries = []

    def _answer(self, seen: int, query: dict[str, str]) -> Answer:
        # The answer to scripted request number ``seen`` (from 1); under the lock.
        if seen > self.max_requests:
            return Answer(body=_CAPPED, status=400)
        answers = self._answers
        answer = answers(seen, query) if callable(answers) else answers[min(seen, len(answers)) - 1]
        return answer if isinstance(answer, Answer) else Answer(body=answer)

    def __enter__(self) -> ListingServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving and end any trickle."""
        self._stopping.set()
        if self._thread.is_alive():
            self._http.shutdown()
            self._thread.join()
        self._http.server_close()

    def _serve(self, request: http.server.BaseHTTPRequestHandler) -> None:
        target = urllib.parse.urlsplit(request.path)
        query = dict(urllib.parse.parse_qsl(target.query, keep_blank_values=True))
        if query.get("list-type") != "2":
            answer = Answer(body=b"", status=404)
        elif self.bait and query.get("encoding-type") != "url":
            answer = Answer(body=_BAIT)
        else:
            with self._lock:
                self.queries.append(query)
                answer = self._answer(len(self.queries), query)
        with contextlib.suppress(OSError):  # the client gave up: nothing more to send
            request.send_response(answer.status)
            request.send_header("Content-Type", "application/xml")
            request.send_header("Content-Length", str(len(answer.body)))
            request.end_headers()
            if answer.trickle_s is None:
                request.wfile.write(answer.body)
                return
            request.wfile.flush()
            ends = time.monotonic() + self.trickle_for_s
            for i in range(len(answer.body)):
                if self._stopping.wait(answer.trickle_s) or time.monotonic() > ends:
                    request.close_connection = True
                    return
                request.wfile.write(answer.body[i : i + 1])
                request.wfile.flush()
