"""Pretrain a tiny byte-level language model over two processes, checkpoint it, and resume.

    torchrun --nproc_per_node=2 examples/lm_pretrain.py [--workdir DIR] [--steps N]

(Plain ``python examples/lm_pretrain.py`` runs the same on one process.) Rank 0 writes a
small generated corpus as JSONL, tokenizes it byte by byte (``list(text.encode())``, an
end-of-text id 256 after each document) and packs it with ``pack_tokens`` into a local
token dataset. Every rank then trains a one-layer causal transformer on its share of the
sequences of 64 tokens (a cross-entropy of each position's logits against ``targets``, the
next tokens), ``TorchLoader`` finding its rank through ``torch.distributed`` (gloo).
Every batch holds 8 sequences (an epoch's short last one is left out). Halfway, the run
saves a checkpoint (the model, the optimizer and the loader's ``state_dict()``, a few
integers, as JSON), throws everything away and resumes from it, as a restarted job would:
the second half continues with the sequences after the ones already trained on, none
again. Each rank logs the sequence ids of each step to ``DIR/rank-R.jsonl``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from stoker import OrderConfig
from stoker.integrations.torch import TorchLoader
from stoker.pack.tokens import TokenPackConfig, pack_tokens

SEQ_LEN = 64
BATCH_SIZE = 8
EOS = 256  # after the 256 byte values
VOCAB = 257

ANIMALS = ["fox", "heron", "badger", "otter", "wren", "lynx", "hare", "owl"]
VERBS = ["jumps over", "runs past", "sleeps beside", "watches", "circles", "hides under"]
PLACES = ["the old mill", "a frozen river", "the hedge", "a quiet field", "the stone wall"]


def corpus(documents: int = 300, seed: int = 0) -> list[str]:
    """Short documents of generated sentences: enough structure for a tiny model to learn."""
    rng = random.Random(seed)
    texts = []
    for _ in range(documents):
        sentences = [
            f"The {rng.choice(ANIMALS)} {rng.choice(VERBS)} {rng.choice(PLACES)}."
            for _ in range(rng.randint(1, 6))
        ]
        texts.append(" ".join(sentences))
    return texts


def tokenize(text: str) -> list[int]:
    """A byte-level tokenizer: one id per UTF-8 byte."""
    return list(text.encode())


def prepare(workdir: Path) -> Path:
    """Write the corpus as JSONL and pack it into ``workdir/tokens``."""
    source = workdir / "corpus.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus()))
    destination = workdir / "tokens"
    config = TokenPackConfig(eos_id=EOS, vocab_size=VOCAB, max_shard_bytes=8_000)
    report = pack_tokens(source, destination, config=config, tokenizer=tokenize)
    tokens = report.tokens.tokens if report.tokens else 0
    say(f"packed {report.samples} documents, {tokens} tokens")
    return destination


class TinyLM(nn.Module):
    """Embedding, one causal transformer layer, and a projection back to the vocabulary."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(SEQ_LEN, width)
        self.layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
        self.out = nn.Linear(width, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ_LEN))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.position(torch.arange(ids.shape[1]))
        return self.out(self.layer(x, src_mask=self.mask, is_causal=True))


def build(tokens: Path, distributed: bool) -> tuple[nn.Module, Any, TorchLoader]:
    torch.manual_seed(0)
    model: nn.Module = TinyLM()
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # Blocks of 16 sequences: the default 4 MB blocks would hold this whole corpus.
    loader = TorchLoader(
        tokens, seq_len=SEQ_LEN, batch_size=BATCH_SIZE, seed=0, order=OrderConfig(block_size=16)
    )
    return model, optimizer, loader


def train(model: nn.Module, optimizer: Any, loader: TorchLoader, steps: range, log: Path) -> float:
    """Train for ``steps`` (continuing the loader's epochs); return the last loss."""
    loss = torch.zeros(())
    step = steps.start
    with log.open("a") as out:
        while step < steps.stop:
            for batch in loader:
                logits = model(batch["input_ids"])
                # targets: the next token of each input (a Hugging Face causal LM takes
                # labels=batch["labels"] instead, equal to input_ids, and shifts them itself).
                targets = batch["targets"].flatten()
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                out.write(json.dumps({"step": step, "index": batch["index"].tolist()}) + "\n")
                step += 1
                if step % 5 == 0:
                    say(f"rank {rank()} step {step} loss {loss.item():.3f}")
                if step == steps.stop:
                    break
    return float(loss.item())


def say(line: str) -> None:
    """Print a line in one write, so the ranks' lines do not interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def save(path: Path, model: nn.Module, optimizer: Any, loader: TorchLoader) -> None:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    path.with_suffix(".loader.json").write_text(json.dumps(loader.state_dict()))


def restore(path: Path, model: nn.Module, optimizer: Any, loader: TorchLoader) -> None:
    weights = torch.load(path, weights_only=True)  # tensors only: no pickled objects
    model.load_state_dict(weights["model"])
    optimizer.load_state_dict(weights["optimizer"])
    loader.load_state_dict(json.loads(path.with_suffix(".loader.json").read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="where data, checkpoint and logs go")
    parser.add_argument("--steps", type=int, default=20, help="training steps in all")
    args = parser.parse_args()
    distributed = dist.is_torchelastic_launched()
    if distributed:
        dist.init_process_group("gloo")  # torchrun sets rank, world size and rendezvous
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if distributed:  # rank 0's temporary folder for everyone
            shared: list[Any] = [str(workdir)]
            dist.broadcast_object_list(shared, src=0)
            workdir = Path(shared[0])
        if rank() == 0:
            prepare(workdir)
        if distributed:
            dist.barrier()  # the dataset is packed
        tokens, log = workdir / "tokens", workdir / f"rank-{rank()}.jsonl"
        half = args.steps // 2

        model, optimizer, loader = build(tokens, distributed)
        first = train(model, optimizer, loader, range(0, half), log)
        checkpoint = workdir / "checkpoint.pt"
        if rank() == 0:
            save(checkpoint, model, optimizer, loader)
        if distributed:
            dist.barrier()  # the checkpoint is written
        del model, optimizer, loader  # a restarted job starts from the checkpoint alone

        model, optimizer, loader = build(tokens, distributed)
        restore(checkpoint, model, optimizer, loader)
        say(f"rank {rank()} resumed at step {half}: {loader.state_dict()}")
        last = train(model, optimizer, loader, range(half, args.steps), log)
        say(f"rank {rank()} loss {first:.3f} at step {half}, {last:.3f} at the end")
        if distributed:
            dist.barrier()  # nobody removes rank 0's folder while others read it
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
