"""JAX: :class:`JaxTokenLoader`, the name token code used before
:class:`~stoker.integrations.jax.JaxLoader` took token sequences. Use ``JaxLoader``::

    loader = JaxLoader("s3://bucket/tokens", seq_len=2048, batch_size=8)
    for batch in loader:
        state, loss = train_step(state, batch["input_ids"], batch["targets"])
"""

from __future__ import annotations

from typing import Any

from stoker.integrations.jax import JaxLoader
from stoker.pipeline.sources import SourceLike


class JaxTokenLoader(JaxLoader):
    """``JaxLoader(source, seq_len=..., batch_size=..., ...)``: token sequences as global
    ``jax.Array`` s (see :class:`~stoker.integrations.jax.JaxLoader`). ``input_ids``,
    ``labels`` and ``targets`` are ``int64`` (``dtype``), kept in 32 bits unless
    ``jax_enable_x64`` is on, as every 64-bit field is.

    Args:
        source: What :class:`stoker.TokenLoader` takes.
        seq_len: Tokens per row of ``input_ids``.
        batch_size: Sequences per batch of this process.
        **options: :class:`~stoker.integrations.jax.JaxLoader`'s ``sharding`` and
            :class:`stoker.TokenLoader`'s settings (``seed``, ``documents``, ``dtype``,
            ``world``, ...).
    """

    def __init__(
        self, source: SourceLike, *, seq_len: int, batch_size: int, **options: Any
    ) -> None:
        super().__init__(source, seq_len=seq_len, batch_size=batch_size, **options)
