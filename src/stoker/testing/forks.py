"""Run a function in a child made by ``fork()``, bounded in time, for tests of fork safety.

A regression in fork safety shows as a child that waits forever; :func:`in_forked_child`
turns that into a ``TimeoutError`` (the child is killed) and a child's exception into an
``AssertionError`` carrying its traceback, so a test fails instead of hanging.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any


def in_forked_child(function: Callable[[], Any], *, timeout_s: float = 60.0) -> Any:
    """``function()`` run in a forked child; its result must pickle.

    Raises:
        TimeoutError: The child did not answer within ``timeout_s`` (it is killed).
        AssertionError: ``function`` raised in the child (the message holds its traceback)
            or the child died without an answer.
    """
    receiver, sender = multiprocessing.get_context("fork").Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(
        target=_answer, args=(function, sender), name="forked-test-child"
    )
    child.start()
    sender.close()
    try:
        if not receiver.poll(timeout_s):
            raise TimeoutError(
                f"{getattr(function, '__name__', function)!r} gave no answer within "
                f"{timeout_s:g} s in a forked child"
            )
        try:
            ok, value = receiver.recv()
        except EOFError:
            child.join(5.0)
            raise AssertionError(
                f"the forked child died without an answer (exit code {child.exitcode})"
            ) from None
    finally:
        if child.is_alive():
            child.kill()
        child.join(5.0)
        receiver.close()
    if not ok:
        raise AssertionError(f"in the forked child:\n{value}")
    return value


def _answer(function: Callable[[], Any], sender: Connection) -> None:
    try:
        answer = (True, function())
    except BaseException:  # reported to the parent, whatever it was
        answer = (False, traceback.format_exc())
    sender.send(answer)
    sender.close()
