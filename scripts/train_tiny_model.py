"""Train the tiny checkpoint that `make demo` serves: src/pagedattn/assets/tiny-stdlib/.

    .venv/bin/python scripts/train_tiny_model.py [--out DIR] [--steps 700] [--threads 2]

Data: the `.py` files of this interpreter's standard library (sysconfig's "stdlib" path; tests,
idlelib and site-packages left out), in sorted order, joined by "<|endoftext|>". Text found on
every machine, so anyone can rebuild the checkpoint (the exact bytes depend on the Python
version: the README the script writes records it).

1. A byte-level BPE tokenizer (the `tokenizers` library, vocabulary 2048, so any text encodes),
   saved as tokenizer.json + tokenizer_config.json (transformers' PreTrainedTokenizerFast).
2. A tiny LlamaForCausalLM (transformers): hidden 256, 4 layers, 4 heads / 2 KV heads,
   intermediate 704, tied embeddings, 512 positions (about 3.6 M parameters). Trained on the
   CPU with AdamW (warmup, cosine decay) on random 256-token windows of the first 98% of the
   token stream, seeded; the last 2% is held out for the validation loss.
3. Saved with save_pretrained (safetensors, bfloat16: about 7 MB) and a README.md with the
   command, the Python version, the loss curve and the size.

Every random choice is seeded (`--seed`), so two runs on the same Python and torch give the
same weights up to floating-point reduction order.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import sysconfig
import time
from pathlib import Path

import torch

EOS = "<|endoftext|>"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "src" / "pagedattn" / "assets" / "tiny-stdlib"
SKIP_PARTS = {"test", "tests", "idle_test", "idlelib", "site-packages", "dist-packages"}


def stdlib_files() -> list[Path]:
    """The standard library's .py files, in sorted (deterministic) order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for f in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        if SKIP_PARTS.intersection(f.relative_to(root).parts):
            continue
        files.append(f)
    return files


def read_corpus(max_bytes: int) -> tuple[list[str], int]:
    """The files' texts (stopping before max_bytes in all) and the bytes read."""
    texts, total = [], 0
    for f in stdlib_files():
        try:
            t = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if total + len(t.encode()) > max_bytes:
            break
        texts.append(t)
        total += len(t.encode())
    return texts, total


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def build_model(vocab_size: int, eos_id: int, seed: int):
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def eval_loss(model, data: torch.Tensor, seq: int, batches: int, batch: int) -> float:
    model.eval()
    g = torch.Generator().manual_seed(1234)
    losses = []
    for _ in range(batches):
        idx = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[i : i + seq] for i in idx.tolist()])
        losses.append(model(input_ids=x, labels=x).loss.item())
    model.train()
    return sum(losses) / len(losses)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    ap.add_argument("--steps", type=int, default=1500, help="optimizer steps")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    ap.add_argument("--vocab", type=int, default=2048, help="BPE vocabulary size")
    ap.add_argument("--max-mb", type=float, default=12.0, help="corpus bytes to read, in MB")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the windows")
    ap.add_argument("--log-every", type=int, default=25, help="steps between loss lines")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()

    texts, nbytes = read_corpus(int(args.max_mb * 1e6))
    print(f"corpus: {len(texts)} files, {nbytes / 1e6:.2f} MB", flush=True)
    tok = train_tokenizer(texts, args.vocab)
    eos_id = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos_id)
    data = torch.tensor(ids, dtype=torch.long)
    split = int(len(data) * 0.98)
    train, val = data[:split], data[split:]
    print(
        f"tokenizer: vocab {tok.get_vocab_size()}, {len(data)} tokens "
        f"({nbytes / len(data):.2f} bytes/token), {time.perf_counter() - t_start:.0f} s",
        flush=True,
    )

    model = build_model(tok.get_vocab_size(), eos_id, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    g = torch.Generator().manual_seed(args.seed)
    warmup = max(1, args.steps // 20)
    curve = []
    t0 = time.perf_counter()
    model.train()
    running = None
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, warmup)
        idx = torch.randint(0, len(train) - args.seq - 1, (args.batch,), generator=g)
        x = torch.stack([train[i : i + args.seq] for i in idx.tolist()])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        if (step + 1) % args.log_every == 0 or step == 0 or step + 1 == args.steps:
            el = time.perf_counter() - t0
            curve.append({"step": step + 1, "train_loss": round(running, 4), "s": round(el, 1)})
            print(f"step {step + 1:5d}  loss {running:.3f}  {el:6.0f} s", flush=True)
    train_s = time.perf_counter() - t0
    val_loss = eval_loss(model, val, args.seq, 8, args.batch)
    print(f"validation loss {val_loss:.3f} (held-out last 2%)", flush=True)

    save(model, tok, args, curve, val_loss, train_s, nbytes, len(texts), len(data), n_params)
    samples = sample(args.out)
    write_readme(args.out, samples)
    print(f"total {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0


def save(model, tok, args, curve, val_loss, train_s, nbytes, nfiles, ntokens, n_params) -> None:
    import transformers

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*"):
        if f.is_file():
            f.unlink()
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    save_tokenizer(tok, out)
    (out / "training_log.json").write_text(
        json.dumps(
            {
                "command": "python scripts/train_tiny_model.py " + " ".join(sys.argv[1:]),
                "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "corpus_files": nfiles,
                "corpus_bytes": nbytes,
                "corpus_tokens": ntokens,
                "parameters": n_params,
                "train_seconds": round(train_s, 1),
                "final_train_loss": curve[-1]["train_loss"],
                "validation_loss": round(val_loss, 4),
                "curve": curve,
            },
            indent=1,
        )
        + "\n"
    )
    size = sum(f.stat().st_size for f in out.glob("*") if f.is_file())
    print(f"saved {out} ({size / 1e6:.1f} MB before README)", flush=True)


def save_tokenizer(tok, out: Path) -> None:
    """tokenizer.json + tokenizer_config.json (transformers' PreTrainedTokenizerFast)."""
    import transformers

    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=None
    )
    fast.save_pretrained(out)
    # The name that transformers 4.x and 5.x both know (5.x saves its alias TokenizersBackend).
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


SAMPLE_PROMPTS = ("def ", "import os\n", "class Foo:\n    def __init__(self")


@torch.no_grad()
def sample(out: Path) -> list[str]:
    """Greedy continuations of a few prompts with transformers (a sanity check)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    texts = []
    for prompt in SAMPLE_PROMPTS:
        x = torch.tensor([tok.encode(prompt)])
        y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=40, do_sample=False)
        texts.append(tok.decode(y[0].tolist()))
        print(f"--- {prompt!r}\n{texts[-1]}", flush=True)
    return texts


def write_readme(out: Path, samples: list[str]) -> None:
    """README.md of the folder: how it was made, the loss curve, the size, greedy samples."""
    log = json.loads((out / "training_log.json").read_text())
    size = sum(f.stat().st_size for f in out.glob("*") if f.is_file() and f.name != "README.md")
    curve = log["curve"]
    step = max(1, len(curve) // 8)
    picks = {c["step"]: c for c in curve[::step] + curve[-1:]}
    rows = "\n".join(
        f"| {c['step']} | {c['train_loss']:.3f} | {c['s']:.0f} |" for c in picks.values()
    )
    a = log["args"]
    shown = "\n\n".join(f"```python\n{t}\n```" for t in samples)
    text = f"""# tiny-stdlib

A {log["parameters"] / 1e6:.2f} M parameter Llama (hidden 256, 4 layers, 4 heads / 2 KV heads,
intermediate 704, tied embeddings, 512 positions) with a byte-level BPE tokenizer of
{a["vocab"]} tokens, trained on the Python standard library's source. `pagedattn demo` serves
it; `pagedattn generate` and `pagedattn bench-serve` use it by default. It writes Python-shaped
text (indentation, `def`, `self.`, docstrings), not working code.

Made by `scripts/train_tiny_model.py` (its defaults) on a CPU with one torch thread:

    .venv/bin/python scripts/train_tiny_model.py

(`training_log.json` has the exact command of this run.)

- Data: the {log["corpus_files"]} `.py` files of Python {log["python"]}'s standard library
  (tests, idlelib and site-packages left out), sorted by path: {log["corpus_bytes"] / 1e6:.1f}
  MB, {log["corpus_tokens"] / 1e6:.2f} M tokens; the last 2% held out.
- Training: {a["steps"]} AdamW steps of {a["batch"]} x {a["seq"]} tokens (peak lr {a["lr"]},
  warmup then cosine to 10%, weight decay 0.1, seed {a["seed"]}): {log["train_seconds"]:.0f} s
  (torch {log["torch"]}, transformers {log["transformers"]}).
- Final training loss {log["final_train_loss"]:.3f} (a moving average over the last steps);
  validation loss {log["validation_loss"]:.3f} nats a token (ln {a["vocab"]} =
  {math.log(a["vocab"]):.2f} at the start).
- Size: {size / 1e6:.1f} MB (weights in bfloat16, `model.safetensors`).

| step | training loss | seconds |
|---|---|---|
{rows}

Greedy continuations (transformers, float32; greedy decoding of so small a model soon repeats
itself, which is why the demo samples at temperature 0.7):

{shown}

Files: `config.json`, `generation_config.json`, `model.safetensors`, `tokenizer.json`,
`tokenizer_config.json` (transformers' `save_pretrained`), `training_log.json` (the arguments,
versions and the whole loss curve).
"""
    (out / "README.md").write_text(text)


if __name__ == "__main__":
    sys.exit(main())
