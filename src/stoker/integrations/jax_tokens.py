"""JAX: token sequences as ``jax.Array`` s, the batch axis sharded over devices.

::

    loader = JaxTokenLoader("s3://bucket/tokens", seq_len=2048, batch_size=8)
    for batch in loader:
        state, loss = train_step(state, batch["input_ids"], batch["targets"])

A :class:`stoker.TokenLoader` makes each batch in numpy; this module places it as
:mod:`stoker.integrations.jax` places a :class:`stoker.Loader`'s: each process is one rank
(``jax.process_index()`` of ``jax.process_count()``), its rows are its devices' part of
one global array, and the next batch is copied while the current one is used.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np

from stoker.integrations.delivering import Delivering
from stoker.integrations.jax import batch_sharding, detect_world
from stoker.pipeline.token_loader import TokenLoader
from stoker.pipeline.world import World

#: Fields with one row per sequence, placed with the batch's sharding; the others
#: (``cu_seqlens``, ``doc_lens``, ``max_seqlen``: sized by the documents) stay on the host.
ROW_FIELDS = ("input_ids", "labels", "targets", "position_ids", "index", "source")


class JaxTokenLoader(Delivering):
    """Batches of a :class:`stoker.TokenLoader` as global ``jax.Array`` s.

    ``input_ids``, ``labels`` (equal to ``input_ids``: Hugging Face's convention),
    ``targets`` (the next token of each input), ``position_ids``, ``index`` and ``source``
    are laid out by ``sharding`` along the batch axis (every batch full, one shape for
    ``jit``, unless ``drop_last=False``); ``cu_seqlens``, ``doc_lens`` and ``max_seqlen``
    stay numpy on the host (their sizes follow the documents). ``dtype`` defaults to
    ``"int32"``, JAX's integer without ``jax_enable_x64``. ``state_dict`` counts the batches
    delivered, not the one on its way to the devices.

    Args:
        source: What :class:`stoker.TokenLoader` takes.
        seq_len: Tokens per row of ``input_ids``.
        batch_size: Sequences per batch of this process; the local devices of the batch
            axis each get an equal part, so it must divide evenly.
        sharding: Where batches go; default
            :func:`~stoker.integrations.jax.batch_sharding` over all devices.
        world: This rank; default this process of ``jax.process_count()``.
        **options: :class:`stoker.TokenLoader`'s other settings.

    Attributes:
        loader: The :class:`stoker.TokenLoader` making the batches.
        sharding: Where batches go.
    """

    loader: TokenLoader

    def __init__(
        self,
        source: Any,
        *,
        seq_len: int,
        batch_size: int,
        sharding: jax.sharding.Sharding | None = None,
        world: World | None = None,
        **options: Any,
    ) -> None:
        if world is None:
            rank, world_size = detect_world()
            world = World(rank=rank, world_size=world_size)
        options.setdefault("dtype", "int32")
        self.sharding = sharding if sharding is not None else batch_sharding()
        self.loader = TokenLoader(
            source, seq_len=seq_len, batch_size=batch_size, world=world, **options
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # Placing is asynchronous: each copy runs while the caller uses the last batch.
        return self._delivered(self._place, ahead=True)

    def _place(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        # jax leaves make_array_from_process_local_data unannotated.
        place: Any = jax.make_array_from_process_local_data
        return {
            name: place(self.sharding, value)
            if name in ROW_FIELDS and isinstance(value, np.ndarray)
            else value
            for name, value in batch.items()
        }
