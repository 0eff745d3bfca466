"""PyTorch: token sequences as tensors, pinned and on the device one batch ahead.

::

    loader = TorchTokenLoader("s3://bucket/tokens", seq_len=2048, batch_size=8,
                              device="cuda", pin_memory=True)
    for batch in loader:
        logits = model(batch["input_ids"])          # (8, 2048) int64 on the GPU
        loss = F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())
        # or a Hugging Face causal LM, which shifts its labels (equal to input_ids) itself:
        # loss = hf_model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

A :class:`stoker.TokenLoader` makes each batch in numpy in this process (casting
sequences takes microseconds each, so no worker processes are needed); this module turns
it into tensors. Under ``torchrun`` (DDP, FSDP) the rank and world size come from
``torch.distributed``, as :func:`stoker.integrations.torch.detect_world` reads them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from stoker.integrations.delivering import Delivering
from stoker.integrations.torch import detect_world
from stoker.integrations.torch_tensors import each_tensor, to_tensors
from stoker.pipeline.token_loader import TokenLoader
from stoker.pipeline.world import World


class TorchTokenLoader(Delivering):
    """Batches of a :class:`stoker.TokenLoader` as tensors.

    ``input_ids``, ``labels`` (equal to ``input_ids``, as Hugging Face takes them),
    ``targets`` (the next token of each input), ``index`` (and ``source`` in a mix,
    ``position_ids`` and
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
            ``drop_last``, ``dtype``, ``order``, ``cache``, ``storage_options``, ...).

    Attributes:
        loader: The :class:`stoker.TokenLoader` making the batches.
    """

    loader: TokenLoader

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

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # With a device, each copy is issued before the caller gets the previous batch;
        # without one there is nothing to overlap, and each batch is handed over as it comes.
        return self._delivered(self._tensors, ahead=self.device is not None)

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
