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
biases N(0, 0.02^2), DeepSeek-V3's router `e_score_correction_bias` included (one per
expert: small beside the sigmoid scores it shifts, so routing still follows the scores);
attention sinks N(0, 1).

FP8 block weights (a config whose `quantization_config` is DeepSeek's fp8 with
`weight_block_size` [n, k]; `fp8_block`): the checkpoint then holds, as DeepSeek's FP8
releases do, every attention and MLP projection (`FP8_LINEARS`: q / q_a / q_b / kv_a / kv_b /
o, and gate / up / down of the dense MLP, the shared experts and every routed expert) as an
e4m3 `<name>.weight` beside a float32 `<name>.weight_scale_inv` [cdiv(out, n), cdiv(in, k)];
norms, embeddings, lm_head and the router (`mlp.gate.weight`, its correction bias) stay in the
model dtype. Each such weight is drawn exactly as the plain model's (`random_tensor`, in
`dtype`), then quantized in n x k blocks, scale = amax(|block|) / 448 (partial last blocks
allowed; `pagedattn.ops.linear.quantize_weight_blocks`, DeepSeek's rule): the FP8 model's
weights are the rounding of the plain model's of the same seed.
"""

from __future__ import annotations

import zlib

import torch

from pagedattn.models import ModelConfig, model_class
from pagedattn.models.loader import fill_weights
from pagedattn.ops.linear import quantize_weight_blocks

# The linears DeepSeek's FP8 checkpoints store as e4m3 blocks (the module name before
# `.weight`); the router `gate`, norms, embeddings and lm_head are not among them.
FP8_LINEARS = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
               "gate_proj", "up_proj", "down_proj")  # fmt: skip
SCALE_SUFFIX = "_scale_inv"  # `<linear>.weight` -> `<linear>.weight_scale_inv`


def hf_config(cfg_dict: dict):
    """transformers' config object of the config.json fields `cfg_dict` (its `model_type`)."""
    import transformers  # noqa: PLC0415 - the benchmarks' peer library, imported late

    skip = ("model_type", "architectures", "quantization_config")  # names and shapes only
    fields = {k: v for k, v in cfg_dict.items() if k not in skip}
    return transformers.AutoConfig.for_model(cfg_dict["model_type"], **fields)


def fp8_block(cfg_dict: dict) -> tuple[int, int] | None:
    """(n, k) of the config's FP8 weight blocks (`quantization_config` fp8, DeepSeek's
    `weight_block_size`), or None for a plain checkpoint."""
    q = cfg_dict.get("quantization_config") or {}
    if q.get("quant_method") != "fp8":
        return None
    n, k = q["weight_block_size"]
    return int(n), int(k)


def fp8_quantized(name: str, shape: tuple[int, ...]) -> bool:
    """Whether checkpoint tensor `name` of `shape` is an FP8 block weight in an FP8 checkpoint
    (a 2-D `.weight` of one of `FP8_LINEARS`)."""
    parts = name.split(".")
    return (
        len(shape) == 2 and len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in FP8_LINEARS
    )


def checkpoint_shapes(cfg_dict: dict) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of the checkpoint transformers would save for `cfg_dict`
    (its model built on the meta device: no memory, no weights); with FP8 blocks (n, k)
    (`fp8_block`) also each quantized weight's `weight_scale_inv` [cdiv(out, n), cdiv(in, k)]
    (the weight's own shape is the same; its dtype becomes e4m3)."""
    import transformers  # noqa: PLC0415

    cls = getattr(transformers, cfg_dict["architectures"][0])
    with torch.device("meta"):
        hf = cls._from_config(hf_config(cfg_dict))
    # state_dict: the parameters and the persistent buffers a checkpoint holds (DeepSeek-V3's
    # router keeps `e_score_correction_bias` as a buffer)
    shapes = {name: tuple(t.shape) for name, t in hf.state_dict().items()}
    # transformers 5 fuses the experts of DeepSeek and the Llama family's MoE models in memory
    # ([E, 2I, H] / [E, H, I]) but saves them per expert (`experts.{e}.gate_proj.weight` ...),
    # the names the loader reads (the fused ones would be tensors no parameter takes, which
    # the loader refuses); gpt-oss saves its fused tensors, which its loader reads.
    fused_saved = cfg_dict["architectures"][0] == "GptOssForCausalLM"
    for name, shape in list(shapes.items()):
        base, _, last = name.rpartition(".")
        if fused_saved or not base.endswith("experts") or len(shape) != 3:
            continue
        if last == "gate_up_proj":
            for e in range(shape[0]):
                for part in ("gate_proj", "up_proj"):
                    shapes[f"{base}.{e}.{part}.weight"] = (shape[1] // 2, shape[2])
            del shapes[name]
        elif last == "down_proj":
            for e in range(shape[0]):
                shapes[f"{base}.{e}.down_proj.weight"] = (shape[1], shape[2])
            del shapes[name]
    block = fp8_block(cfg_dict)
    if block is not None:
        n, k = block
        for name, shape in list(shapes.items()):
            if fp8_quantized(name, shape):
                shapes[name + SCALE_SUFFIX] = (-(-shape[0] // n), -(-shape[1] // k))
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


def random_fp8_weight(
    name: str, shape: tuple[int, int], device, dtype, seed: int, block: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, float32 weight_scale_inv) of checkpoint weight `name`: `random_tensor`'s
    draw in `dtype`, quantized in `block` = (n, k) blocks (module docstring)."""
    w = random_tensor(name, shape, device, dtype, seed)
    return quantize_weight_blocks(w, block[0], block[1])


def checkpoint_reader(cfg_dict: dict, device, dtype, seed: int):
    """`read(name)` of the generated checkpoint of `cfg_dict` (what `fill_weights` calls): plain
    tensors from `random_tensor`; with FP8 blocks, each `FP8_LINEARS` weight e4m3 and its
    `weight_scale_inv` (one draw and quantization serve both: the scale waits in a dict until
    read, or the weight is drawn again when the scale is read first)."""
    shapes = checkpoint_shapes(cfg_dict)
    block = fp8_block(cfg_dict)
    pending: dict[str, torch.Tensor] = {}  # weight name -> its scales, drawn with the weight

    def read(name: str) -> torch.Tensor:
        if block is not None and name.endswith(".weight" + SCALE_SUFFIX):
            w_name = name.removesuffix(SCALE_SUFFIX)
            s = pending.pop(w_name, None)
            if s is None:
                _, s = random_fp8_weight(w_name, shapes[w_name], device, dtype, seed, block)
            return s
        shape = shapes[name]
        if block is not None and fp8_quantized(name, shape):
            q, pending[name] = random_fp8_weight(name, shape, device, dtype, seed, block)
            return q
        return random_tensor(name, shape, device, dtype, seed)

    return read


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
    (FP8 blocks where the config says so; module docstring); with tp_size > 1, rank
    `tp_rank`'s shard (torch.distributed initialized with that world size)."""
    cfg = ModelConfig.from_hf(cfg_dict)
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    kw = {"tp_size": tp_size, "tp_rank": tp_rank} if tp_size > 1 else {}
    with torch.device("meta"):
        model = model_class(cfg)(cfg, dtype=dtype, **kw)
    model.to_empty(device=dev)
    model.rotary_emb.reset_buffers(dev)
    fill_weights(model, checkpoint_reader(cfg_dict, dev, dtype, seed))
    return model.eval()
