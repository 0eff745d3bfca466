"""AWS Signature V4 for the few requests stoker sends itself (obstore signs the rest):
the raw listing fallback (:mod:`stoker.storage.rawlist`) and bucket administration on the
test server (:mod:`stoker.testing.sigv4`)."""

from __future__ import annotations

import datetime
import hashlib
import hmac


def sigv4_headers(
    method: str,
    host: str,
    path: str,
    query: str = "",
    *,
    access_key: str | None,
    secret_key: str | None,
    region: str,
    body: bytes = b"",
    session_token: str | None = None,
) -> dict[str, str]:
    """The headers of an S3 request signed now (unsigned, for anonymous access, when
    ``secret_key`` is None).

    Args:
        method: HTTP method.
        host: The ``Host`` header (with the port when it is not the scheme's).
        path: The URI-encoded path.
        query: The canonical query string (keys sorted, values URI-encoded).
        access_key: The access key id.
        secret_key: The secret access key, or None for an unsigned request.
        region: Signing region.
        body: The request body (hashed into the signature).
        session_token: A temporary credential's token.
    """
    now = datetime.datetime.now(datetime.UTC)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(body).hexdigest()
    headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
    if session_token:
        headers["x-amz-security-token"] = session_token
    if secret_key is None:
        return headers
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        [
            method,
            path,
            query,
            "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
            signed,
            payload,
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + secret_key).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed}, "
        f"Signature={signature}"
    )
    return headers
