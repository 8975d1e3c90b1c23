"""Loading models from Hugging Face checkpoint folders through `safetensors`.

A checkpoint folder holds `config.json` and either `model.safetensors` or a sharded
`model.safetensors.index.json` (its `weight_map` names each tensor's file).

- `load_model(path, device=..., dtype=..., kv_params=...)`: config -> class (registry) ->
  model built on the meta device -> materialised on `device` -> every parameter read by name.
- `load_weights(model, path)`: fill an existing model's parameters. Each parameter has a
  `WeightSource` (`weights.py`; `weight_sources`): the checkpoint tensors it is made of (one,
  or the q/k/v or gate/up tensors a fused projection concatenates, or an MXFP4 blocks/scales
  pair) and how to combine them. A parameter whose tensors are missing, a tensor of the wrong
  shape, or (with `strict`) a checkpoint tensor no parameter uses raise `CheckpointError`
  naming them.
  Ignored without complaint: `*.rotary_emb.inv_freq` buffers and `lm_head.weight` of a model
  with tied embeddings (transformers ignores it too).
- Model hooks (optional methods): `model.checkpoint_source(param_name) -> WeightSource | None`
  gives a parameter's source where the default rules do not (DeepSeek's stacked experts from
  per-expert tensors); `model.ignores_checkpoint_tensor(name) -> bool` names checkpoint tensors
  to ignore quietly (DeepSeek's multi-token-prediction layers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

import torch
from torch import nn

from ..errors import InvalidArgumentError
from .config import ModelConfig
from .weights import WeightSource

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
IGNORED = (re.compile(r"(^|\.)rotary_emb\.inv_freq$"),)

# MXFP4 (e2m1) code points, low nibble first (transformers.integrations.mxfp4.FP4_VALUES).
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0) + (
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)  # fmt: skip


class CheckpointError(InvalidArgumentError):
    """A checkpoint that does not match the model: missing, unexpected or misshapen tensors,
    or no safetensors files. The message names the tensors."""


def _cat0(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(ts, dim=0)


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """gpt-oss MXFP4 expert weights -> dense, in the model's layout.

    blocks [E, rows, G, 16] uint8 (two e2m1 codes a byte, low nibble first), scales [E, rows, G]
    uint8 (e8m0 exponents, bias 127): row r's elements g*32 .. g*32+31 are code * 2^(scale-127).
    Returns [E, G * 32, rows] (transposed, as transformers' `convert_moe_packed_tensors`).
    """
    if blocks.shape[:-1] != scales.shape:
        raise CheckpointError(
            f"mxfp4: blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not match"
        )
    lut = torch.tensor(FP4_VALUES, dtype=dtype, device=blocks.device)
    b = blocks.to(torch.uint8)
    codes = torch.stack(((b & 0x0F).long(), (b >> 4).long()), dim=-1).flatten(-2)  # [..., G, 32]
    vals = torch.ldexp(lut[codes], (scales.to(torch.int32) - 127)[..., None].to(dtype))
    out = vals.flatten(-2)  # [E, rows, G*32]
    return out.transpose(1, 2).contiguous()


def _mxfp4(ts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return dequantize_mxfp4(ts[0], ts[1], dtype)


def weight_sources(model: nn.Module) -> dict[str, WeightSource]:
    """Parameter name -> its `WeightSource`. Fused modules (`model.packed_modules`, e.g.
    `qkv_proj` <- q_proj, k_proj, v_proj) concatenate their parts along dim 0; gpt-oss MXFP4
    checkpoints give the expert matrices as `<name>_blocks` + `<name>_scales`. A model with
    `tp_size > 1` reads this rank's slice of the tensors of its parallel linears (their
    `tp_shard`: parameter -> dim)."""
    packed: dict[str, tuple[str, ...]] = getattr(model, "packed_modules", {})
    cfg: ModelConfig | None = getattr(model, "config", None)
    quant = (cfg.quantization or {}) if cfg is not None else {}
    mxfp4 = quant.get("quant_method") == "mxfp4"
    tp, tp_rank = getattr(model, "tp_size", 1), getattr(model, "tp_rank", 0)
    custom = getattr(model, "checkpoint_source", None)
    out: dict[str, WeightSource] = {}
    for name, p in model.named_parameters():
        if custom is not None and (src := custom(name)) is not None:
            out[name] = src
            continue
        parts = name.split(".")
        dim = None
        if tp > 1:
            mod = model.get_submodule(".".join(parts[:-1]))
            dim = getattr(mod, "tp_shard", {}).get(parts[-1])
        src = WeightSource((name,))
        if len(parts) >= 2 and parts[-2] in packed:
            mod = parts[-2]
            names = tuple(".".join([*parts[:-2], sub, parts[-1]]) for sub in packed[mod])
            src = WeightSource(names, _cat0)
        elif mxfp4 and parts[-1] in ("gate_up_proj", "down_proj") and "experts" in parts:
            dt = p.dtype
            src = WeightSource(
                (f"{name}_blocks", f"{name}_scales"), lambda ts, dt=dt: _mxfp4(ts, dt)
            )
        if dim is not None:
            src = dataclasses.replace(src, shard_dim=dim, shard_rank=tp_rank, shard_size=tp)
        out[name] = src
    return out


def checkpoint_index(path: str | os.PathLike) -> dict[str, Path]:
    """Tensor name -> safetensors file of a checkpoint folder (sharded index or single file)."""
    from safetensors import safe_open

    root = Path(path)
    index = root / INDEX_FILE
    if index.is_file():
        with open(index) as f:
            wmap = json.load(f).get("weight_map")
        if not isinstance(wmap, dict):
            raise CheckpointError(f"{index}: no 'weight_map' object")
        files = {fn: root / fn for fn in set(wmap.values())}
        missing = sorted(fn for fn, p in files.items() if not p.is_file())
        if missing:
            raise CheckpointError(f"{index}: shard files missing: {missing}")
        return {name: files[fn] for name, fn in wmap.items()}
    single = root / SINGLE_FILE
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    raise CheckpointError(f"{str(root)!r}: neither {INDEX_FILE} nor {SINGLE_FILE} found")


def _ignored(name: str, tied: bool) -> bool:
    return any(p.search(name) for p in IGNORED) or (tied and name == "lm_head.weight")


def _fmt(names: Sequence[str], limit: int = 20) -> str:
    names = sorted(names)
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


@torch.no_grad()
def load_weights(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    strict: bool = True,
) -> None:
    """Fill every parameter of `model` from the checkpoint folder `path`, converting to each
    parameter's dtype and device. Raises CheckpointError (no parameter written) for missing
    tensors, or with `strict` for unexpected ones; for a shape mismatch, naming the tensor."""
    from safetensors import safe_open

    index = checkpoint_index(path)
    sources = weight_sources(model)
    missing = sorted({n for s in sources.values() for n in s.names if n not in index})
    if missing:
        raise CheckpointError(
            f"checkpoint {str(path)!r} lacks {len(missing)} tensor(s) the model needs: "
            f"{_fmt(missing)}"
        )
    cfg = getattr(model, "config", None)
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    used = {n for s in sources.values() for n in s.names}
    model_ignores = getattr(model, "ignores_checkpoint_tensor", None)
    unexpected = [
        n
        for n in index
        if n not in used
        and not _ignored(n, tied)
        and not (model_ignores is not None and model_ignores(n))
    ]
    if strict and unexpected:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has {len(unexpected)} tensor(s) the model does not use: "
            f"{_fmt(unexpected)}"
        )
    with ExitStack() as stack:
        handles: dict[Path, object] = {}

        def read(name: str) -> torch.Tensor:
            fn = index[name]
            if fn not in handles:
                handles[fn] = stack.enter_context(safe_open(str(fn), framework="pt"))
            return handles[fn].get_tensor(name)

        fill_weights(model, read)


@torch.no_grad()
def fill_weights(model: nn.Module, read: Callable[[str], torch.Tensor]) -> None:
    """Fill every parameter of `model` from `read(name)`, which returns the checkpoint tensor
    `name` whole (the model's `weight_sources` take their tensor-parallel slices and combine
    fused parts), converting to each parameter's dtype and device. `load_weights` reads a
    folder through it; a benchmark can give generated tensors of the checkpoint's names and
    shapes. Raises CheckpointError for a shape mismatch, naming the tensor."""
    params = dict(model.named_parameters())
    for pname, src in weight_sources(model).items():
        p = params[pname]
        try:
            ts = src.read([read(n) for n in src.names])
        except InvalidArgumentError as e:
            raise CheckpointError(f"tensor(s) {list(src.names)} for {pname}: {e}") from None
        if src.combine is None:
            t = ts[0]
        else:
            try:
                t = src.combine(ts)
            except RuntimeError as e:  # torch.cat of mismatched parts
                shapes = [tuple(x.shape) for x in ts]
                raise CheckpointError(
                    f"tensors {list(src.names)} (shapes {shapes}) do not combine into "
                    f"{pname} {tuple(p.shape)}: {e}"
                ) from None
        if tuple(t.shape) != tuple(p.shape):
            raise CheckpointError(
                f"tensor(s) {list(src.names)}: shape {tuple(t.shape)}, the model's {pname} "
                f"expects {tuple(p.shape)}"
            )
        p.copy_(t.to(dtype=p.dtype))


def _as_device(device: str | torch.device | None) -> torch.device:
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def load_model(
    path: str | os.PathLike,
    *,
    device: str | torch.device | None = "cpu",
    dtype: torch.dtype | None = None,
    kv_params=None,
    strict: bool = True,
    tp_size: int = 1,
    tp_rank: int | None = None,
) -> nn.Module:
    """A model from a checkpoint folder, ready for `forward` once a KV cache is attached.

    dtype: the compute dtype (default: the checkpoint's `dtype`/`torch_dtype`, else float32).
    kv_params: optional `KVCacheParams` to attach (`model.attach_kv_cache` later otherwise).
    tp_size / tp_rank: load this rank's tensor-parallel shard (models/parallel.py; Llama
    family only).
    Raises UnsupportedModelError for an unsupported architecture, CheckpointError for a
    checkpoint that does not match its config.
    """
    from .registry import model_class

    cfg = ModelConfig.from_hf(path)
    dtype = dtype or cfg.dtype or torch.float32
    dev = _as_device(device)
    cls = model_class(cfg)
    with torch.device("meta"):
        model = cls(
            cfg, dtype=dtype, **({"tp_size": tp_size, "tp_rank": tp_rank} if tp_size > 1 else {})
        )
    model.to_empty(device=dev)
    model.rotary_emb.reset_buffers(dev)
    load_weights(model, path, strict=strict)
    if kv_params is not None:
        model.attach_kv_cache(kv_params)
    return model.eval()


__all__ = [
    "CheckpointError",
    "WeightSource",
    "checkpoint_index",
    "dequantize_mxfp4",
    "fill_weights",
    "load_model",
    "load_weights",
    "weight_sources",
]
