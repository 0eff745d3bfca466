"""PyTorch: :class:`TorchTokenLoader`, the name token code used before
:class:`~stoker.integrations.torch.TorchLoader` took token sequences. Use ``TorchLoader``::

    loader = TorchLoader("s3://bucket/tokens", seq_len=2048, batch_size=8, num_workers=2,
                         device="cuda", pin_memory=True)
    for batch in loader:
        logits = model(batch["input_ids"])          # (8, 2048) int64 on the GPU
        loss = F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())
        # or a Hugging Face causal LM, which shifts its labels (equal to input_ids) itself:
        # loss = hf_model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
"""

from __future__ import annotations

from typing import Any

from stoker.integrations.torch import TorchLoader
from stoker.pipeline.sources import SourceLike
from stoker.pipeline.token_loader import epoch_sequences
from stoker.pipeline.tokens import stream_tokens


class TorchTokenLoader(TorchLoader):
    """``TorchLoader(source, seq_len=..., batch_size=..., ...)``: token sequences as
    tensors (see :class:`~stoker.integrations.torch.TorchLoader`, which takes the same
    arguments, ``num_workers`` included).

    Args:
        source: What :class:`stoker.TokenLoader` takes.
        seq_len: Tokens per row of ``input_ids``.
        batch_size: Sequences per batch, per rank.
        **options: :class:`~stoker.integrations.torch.TorchLoader`'s other settings
            (``num_workers``, ``pin_memory``, ``device``, ``world``) and
            :class:`stoker.TokenLoader`'s (``seed``, ``documents``, ``drop_last``,
            ``dtype``, ``order``, ``cache``, ``storage_options``, ...).
    """

    def __init__(
        self, source: SourceLike, *, seq_len: int, batch_size: int, **options: Any
    ) -> None:
        super().__init__(source, seq_len=seq_len, batch_size=batch_size, **options)
        self.seq_len = seq_len

    @property
    def dropped_tokens(self) -> int:
        """Tokens an epoch leaves out (see :attr:`stoker.TokenLoader.dropped_tokens`)."""
        source, span = self.dataset.opened(), self.seq_len + 1
        drop_last = self.dataset.options.get("drop_last", True)
        each = epoch_sequences(
            source, world=self.world, batch_size=self.dataset.batch_size, drop_last=drop_last
        )
        return stream_tokens(source, source.units(), span) - each * span
