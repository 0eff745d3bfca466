"""Fuzzing listing keys: what a server lists must never write outside the destination.

Keys are drawn from hostile pieces (``..``, ``.``, empty segments, control characters,
backslashes, unicode) and sent through the parser of the fallback listing (URL-encoded as a
server encodes them) and the local path mapping of ``download``: the parser returns the key
unchanged, and the mapping either gives a path under the destination or refuses the key
with ``ValueError``, exactly when ``key_problem`` names a problem.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.storage.base import key_problem
from stoker.storage.listpage import parse_page
from stoker.storage.transfer import safe_local_path

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

ROOT = Path("/dst/root")

segments = st.one_of(
    st.sampled_from(["", ".", "..", "...", "a", "b.jpg", "\\", "..\\x", "~", "%2e%2e", " "]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="/"), max_size=6),
)
keys = st.lists(segments, min_size=1, max_size=5).map("/".join)


def _listing(listed: list[str]) -> bytes:
    contents = "".join(
        f"<Contents><Key>{urllib.parse.quote_plus(k, safe='/')}</Key><Size>1</Size></Contents>"
        for k in listed
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
        'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><IsTruncated>false</IsTruncated>'
        f"{contents}<EncodingType>url</EncodingType></ListBucketResult>"
    ).encode()


@FUZZ
@given(st.lists(keys, min_size=1, max_size=8))
def test_listed_keys_survive_the_parser_and_never_leave_the_root(listed: list[str]) -> None:
    page = parse_page(_listing(listed))
    assert [meta.key for meta in page.objects] == listed
    for key in listed:
        problem = key_problem(key)
        if problem is not None:
            with pytest.raises(ValueError, match="unsafe path"):
                safe_local_path(ROOT, key)
            continue
        path = safe_local_path(ROOT, key)
        assert path.is_relative_to(ROOT)
        assert ".." not in path.relative_to(ROOT).parts
        assert path != ROOT
