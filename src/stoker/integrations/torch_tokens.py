"""PyTorch: token sequences as tensors, pinned and on the device one batch ahead.

::

    loader = TorchTokenLoader("s3://bucket/tokens", seq_len=2048, batch_size=8,
                              device="cuda", pin_memory=True)
    for batch in loader:
        logits = model(batch["input_ids"])          # (8, 2048) int64 on the GPU
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

A :class:`stoker.TokenLoader` makes each batch in numpy in this process (stacking
sequences takes microseconds each, so no worker processes are needed); this module turns
it into tensors. Under ``torchrun`` (DDP, FSDP) the rank and world size come from
``torch.distributed``, as :func:`stoker.integrations.torch.detect_world` reads them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from stoker.integrations.torch import detect_world
from stoker.integrations.torch_tensors import each_tensor, to_tensors
from stoker.pipeline.stats import LoaderStats
from stoker.pipeline.token_loader import TokenLoader
from stoker.pipeline.world import World


class TorchTokenLoader:
    """Batches of a :class:`stoker.TokenLoader` as tensors.

    ``input_ids``, ``labels``, ``index`` (and ``source`` in a mix, ``position_ids`` and
    ``cu_seqlens`` with ``documents=True``) are tensors sharing the batch's memory, or
    pinned or on ``device`` when asked; ``doc_lens`` is a list of tensors and
    ``max_seqlen`` an int. With ``device`` set, batch ``i + 1`` is copied while the caller
    trains on batch ``i`` (on CUDA with ``pin_memory``, asynchronously). ``state_dict()``
    is the state after the last batch handed out, not after the one on its way.

    Args:
        source: What :class:`stoker.TokenLoader` takes: a token dataset's URL or path, or a
            :class:`~stoker.pipeline.config.SourceConfig` mixing several.
        seq_len: Tokens per row of ``input_ids``.
        batch_size: Sequences per batch, per rank.
        pin_memory: Pin the tensors in page-locked memory (needs CUDA).
        device: Move the tensors there.
        world: This rank; default the rank and world size of an initialised
            ``torch.distributed`` (else rank 0 of 1).
        **options: :class:`stoker.TokenLoader`'s other settings (``seed``, ``documents``,
            ``dtype``, ``order``, ``cache``, ``storage_options``, ...).

    Attributes:
        loader: The :class:`stoker.TokenLoader` making the batches.
    """

    def __init__(
        self,
        source: Any,
        *,
        seq_len: int,
        batch_size: int,
        pin_memory: bool = False,
        device: str | torch.device | None = None,
        world: World | None = None,
        **options: Any,
    ) -> None:
        if world is None:
            rank, world_size = detect_world()
            world = World(rank=rank, world_size=world_size)
        self.loader = TokenLoader(
            source, seq_len=seq_len, batch_size=batch_size, world=world, **options
        )
        self.pin_memory = pin_memory
        self.device = torch.device(device) if device is not None else None
        self._state: dict[str, Any] | None = None  # the loader's state at the last delivery

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on."""
        self._state = None
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        """Where the run is (see :meth:`stoker.Loader.state_dict`): a few integers."""
        return dict(self._state) if self._state is not None else self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after the last batch ``state`` counted, on any world size (see
        :meth:`stoker.Loader.load_state_dict`)."""
        self._state = None
        self.loader.load_state_dict(state)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.device is None:  # nothing to overlap: hand each batch over as it comes
            for batch in self.loader:
                self._state = self.loader.state_dict()
                yield self._tensors(batch)
            self._state = None
            return
        upcoming: tuple[dict[str, Any], dict[str, Any]] | None = None
        for batch in self.loader:
            # The copy of this batch is issued before the caller gets the previous one.
            ready = (self._tensors(batch), self.loader.state_dict())
            if upcoming is not None:
                yield self._deliver(upcoming)
            upcoming = ready
        if upcoming is not None:
            yield self._deliver(upcoming)
        self._state = None

    def _deliver(self, upcoming: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
        batch, self._state = upcoming
        return batch

    def _tensors(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        out = to_tensors(batch)
        if not self.pin_memory and self.device is None:
            return out
        for name, value in out.items():
            if isinstance(value, torch.Tensor):
                out[name] = self._place(value)
            elif isinstance(value, list):
                out[name] = [self._place(t) for t in each_tensor(value)]
        return out

    def _place(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.pin_memory:
            tensor = tensor.pin_memory()
        if self.device is not None:
            tensor = tensor.to(self.device, non_blocking=self.pin_memory)
        return tensor

    @property
    def dropped_tokens(self) -> int:
        """Tokens an epoch leaves out (see :attr:`stoker.TokenLoader.dropped_tokens`)."""
        return self.loader.dropped_tokens

    def stats(self) -> LoaderStats:
        """The loader's counters (see :meth:`stoker.Loader.stats`)."""
        return self.loader.stats()

    def close(self) -> None:
        """Stop the loader and close its disk cache's files."""
        self.loader.close()

    def __enter__(self) -> TorchTokenLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
