"""Random-weight models for the model benchmarks, built on the GPU without a checkpoint.

`random_model(cfg_dict, ...)` builds the pagedattn model of a config.json dict (any supported
architecture: `cfg_dict["architectures"]`) on the meta device, materialises it on `device`
and fills it through the loader (`models.loader.fill_weights`) from generated checkpoint
tensors: each tensor of the transformers model's names and shapes (`checkpoint_shapes`) is
drawn on the device from a generator seeded by (seed, crc32 of its name) alone. So a one-GPU
model and every tensor-parallel rank (`tp_size`, which takes its slice of each whole tensor
as it would from a checkpoint) hold the same weights, and the values do not depend on the
order in which parameters are filled.

Values (`random_tensor`): norm weights 1; embeddings N(0, 1); matrices N(0, 1 / fan_in)
(fan_in: the last dim of an [out, in] weight, dim -2 of gpt-oss's [E, in, out] experts);
biases N(0, 0.02^2); attention sinks N(0, 1).
"""

from __future__ import annotations

import zlib

import torch

from pagedattn.models import ModelConfig, model_class
from pagedattn.models.loader import fill_weights


def hf_config(cfg_dict: dict):
    """transformers' config object of the config.json fields `cfg_dict` (its `model_type`)."""
    import transformers  # noqa: PLC0415 - the benchmarks' peer library, imported late

    fields = {k: v for k, v in cfg_dict.items() if k not in ("model_type", "architectures")}
    return transformers.AutoConfig.for_model(cfg_dict["model_type"], **fields)


def checkpoint_shapes(cfg_dict: dict) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of the checkpoint transformers would save for `cfg_dict`
    (its model built on the meta device: no memory, no weights)."""
    import transformers  # noqa: PLC0415

    cls = getattr(transformers, cfg_dict["architectures"][0])
    with torch.device("meta"):
        hf = cls._from_config(hf_config(cfg_dict))
    shapes = {name: tuple(p.shape) for name, p in hf.named_parameters()}
    # transformers 5 fuses DeepSeek's experts in memory ([E, 2I, H] / [E, H, I]) but saves
    # them per expert (`experts.{e}.gate_proj.weight` ...), the names the loader reads.
    for name, shape in list(shapes.items()):
        base, _, last = name.rpartition(".")
        if not base.endswith("experts") or len(shape) != 3:
            continue
        if last == "gate_up_proj":
            for e in range(shape[0]):
                for part in ("gate_proj", "up_proj"):
                    shapes[f"{base}.{e}.{part}.weight"] = (shape[1] // 2, shape[2])
        elif last == "down_proj":
            for e in range(shape[0]):
                shapes[f"{base}.{e}.down_proj.weight"] = (shape[1], shape[2])
    return shapes


def random_tensor(name: str, shape: tuple[int, ...], device, dtype, seed: int) -> torch.Tensor:
    """Checkpoint tensor `name` of `shape`, drawn on `device` from (seed, crc32(name))."""
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    t = torch.empty(shape, dtype=dtype, device=device)
    if name.endswith("norm.weight"):
        return t.fill_(1.0)
    if "embed_tokens" in name:
        return t.normal_(0.0, 1.0, generator=gen)
    if name.endswith("sinks"):
        return t.normal_(0.0, 1.0, generator=gen)
    if len(shape) == 1 or name.endswith("bias"):
        return t.normal_(0.0, 0.02, generator=gen)
    fan_in = shape[-2] if len(shape) == 3 else shape[-1]
    return t.normal_(0.0, fan_in**-0.5, generator=gen)


@torch.no_grad()
def random_model(
    cfg_dict: dict,
    device,
    dtype: torch.dtype,
    seed: int,
    *,
    tp_size: int = 1,
    tp_rank: int | None = None,
) -> torch.nn.Module:
    """The pagedattn model of `cfg_dict` with `random_tensor` weights on `device` in `dtype`
    (module docstring); with tp_size > 1, rank `tp_rank`'s shard (torch.distributed
    initialized with that world size)."""
    cfg = ModelConfig.from_hf(cfg_dict)
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    kw = {"tp_size": tp_size, "tp_rank": tp_rank} if tp_size > 1 else {}
    with torch.device("meta"):
        model = model_class(cfg)(cfg, dtype=dtype, **kw)
    model.to_empty(device=dev)
    model.rotary_emb.reset_buffers(dev)
    shapes = checkpoint_shapes(cfg_dict)
    fill_weights(model, lambda name: random_tensor(name, shapes[name], dev, dtype, seed))
    return model.eval()
