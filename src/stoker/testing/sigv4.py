"""A minimal AWS Signature V4 request, for bucket administration on the test server.

obstore has no bucket-level operations, so creating and deleting buckets on the loopback
SeaweedFS server is done with these requests, signed by :mod:`stoker.storage.sigv4`.
"""

from __future__ import annotations

import http.client

from stoker.storage.sigv4 import sigv4_headers


def signed_request(
    method: str,
    host: str,
    port: int,
    path: str,
    *,
    access_key: str,
    secret_key: str,
    region: str,
    body: bytes = b"",
    timeout_s: float = 5.0,
) -> int:
    """Send one SigV4-signed request over plain HTTP and return the status code."""
    headers = sigv4_headers(
        method,
        f"{host}:{port}",
        path,
        access_key=access_key,
        secret_key=secret_key,
        region=region,
        body=body,
    )
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request(method, path, body=body or None, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()
