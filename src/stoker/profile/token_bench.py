"""Measure a TokenLoader: tokens per second, time to first batch, GETs and bytes read."""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass
from typing import Any

from stoker.core.units import format_bytes
from stoker.pipeline.token_loader import TokenLoader


@dataclass(frozen=True, slots=True)
class TokenBenchResult:
    """What one run of a :class:`~stoker.TokenLoader` measured.

    Attributes:
        seq_len: Tokens per row of ``input_ids``.
        batch_size: Sequences per batch.
        sequences: Sequences delivered.
        batches: Batches delivered.
        tokens: Tokens of ``input_ids`` delivered (``sequences * seq_len``).
        seconds: Wall time from creating the iterator to the last batch.
        first_batch_s: Time from creating the iterator to the first batch.
        tokens_per_s: ``tokens / seconds``.
        cpu_s: CPU seconds of this process (all its threads) over the run.
        cpu_s_per_billion_tokens: ``cpu_s`` per 10**9 tokens of ``input_ids``.
        requests: GET requests made.
        bytes_read: Bytes read from the store.
        token_bytes: Bytes of the stream's tokens the delivered sequences hold (each holds
            ``seq_len + 1``: the inputs and the last target).
        bytes_per_token_byte: ``bytes_read / token_bytes``: 1.0 when every byte read is a
            delivered token (a part of an epoch also reads some sequences ahead).
        epoch_batches: Batches this rank delivers in a whole epoch.
        epoch_tokens: Stream tokens all ranks deliver in a whole epoch.
        stream_tokens: Tokens in the stream.
        requests_per_epoch: GET requests of a whole epoch: ``requests`` when the run was
            one, else at the rate of the sequences delivered so far.
        whole_epoch: Whether the run was a whole epoch.
        peak_rss_mb: Peak resident memory of this process.
    """

    seq_len: int
    batch_size: int
    sequences: int
    batches: int
    tokens: int
    seconds: float
    first_batch_s: float
    tokens_per_s: float
    cpu_s: float
    cpu_s_per_billion_tokens: float
    requests: int
    bytes_read: int
    token_bytes: int
    bytes_per_token_byte: float
    epoch_batches: int
    epoch_tokens: int
    stream_tokens: int
    requests_per_epoch: int
    whole_epoch: bool
    peak_rss_mb: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def bench_tokens(loader: TokenLoader, *, max_batches: int | None = None) -> TokenBenchResult:
    """Run ``loader`` through (at most ``max_batches`` of) one epoch and measure it.

    Args:
        loader: The loader to run; its next epoch is the one measured.
        max_batches: Stop after this many batches (default: the whole epoch).

    Returns:
        The measurements; bytes and GETs are the loader's own counts over the run (the
        next epoch is not read ahead, so they are this epoch's).
    """
    loader.read_ahead = False
    before = loader.stats()
    epoch_batches = loader.batches_per_epoch()
    cpu_started = time.process_time()
    started = time.perf_counter()
    first = 0.0
    batches = sequences = 0
    whole = True
    for batch in loader:
        if batches == 0:
            first = time.perf_counter() - started
        batches += 1
        sequences += len(batch["input_ids"])
        if max_batches is not None and batches >= max_batches:
            whole = batches == epoch_batches
            break
    seconds = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    done = loader.stats().since(before)
    read = done.requests.get("bytes.read", 0)
    gets = done.requests.get("requests.get", 0)
    tokens = sequences * loader.seq_len
    token_bytes = round(sequences * loader.source.unit_bytes())
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return TokenBenchResult(
        seq_len=loader.seq_len,
        batch_size=loader.batch_size,
        sequences=sequences,
        batches=batches,
        tokens=tokens,
        seconds=seconds,
        first_batch_s=first,
        tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
        cpu_s=cpu_s,
        cpu_s_per_billion_tokens=cpu_s / tokens * 1e9 if tokens else 0.0,
        requests=gets,
        bytes_read=read,
        token_bytes=token_bytes,
        bytes_per_token_byte=read / token_bytes if token_bytes else 0.0,
        epoch_batches=epoch_batches,
        epoch_tokens=loader.epoch_tokens,
        stream_tokens=loader.stream_tokens,
        # Part of an epoch: at the rate of the batches delivered.
        requests_per_epoch=gets if whole else round(gets / max(batches, 1) * epoch_batches),
        whole_epoch=whole,
        peak_rss_mb=rss_kb / 1024,
    )


def format_token_bench(result: TokenBenchResult) -> str:
    """The report ``stoker bench --seq-len`` prints."""
    epoch = (
        f"{result.requests_per_epoch:,} GETs per epoch of {result.epoch_batches:,} batches"
        if result.whole_epoch
        else f"about {result.requests_per_epoch:,} GETs per epoch of {result.epoch_batches:,} "
        "batches (at the rate of the batches so far)"
    )
    return "\n".join(
        [
            f"{result.sequences:,} sequences of {result.seq_len:,} tokens "
            f"({result.tokens:,} tokens, batches of {result.batch_size}) in "
            f"{result.seconds:.2f} s: {result.tokens_per_s:,.0f} tokens/s; first batch after "
            f"{result.first_batch_s:.2f} s; {result.cpu_s_per_billion_tokens:,.0f} CPU s per "
            f"billion tokens; peak RSS {result.peak_rss_mb:,.0f} MB.",
            f"Read {format_bytes(result.bytes_read)} in {result.requests:,} GETs for "
            f"{format_bytes(result.token_bytes)} of tokens delivered: "
            f"{result.bytes_per_token_byte:.3f} bytes per token byte; {epoch}.",
        ]
    )
