"""Launch shapes of the routed-experts kernels, as frozen configuration (`MoETuning`).

The numbers' sources: docs/kernels/moe.md. `PAGEDATTN_MOE_TUNING` (a JSON object,
`pagedattn.env.tuning_overrides`) overrides fields for development runs, a shape as a list
[block_n, block_k, stages, num_warps], e.g. '{"gated": [32, 128, 4, 4]}'.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ... import env


@dataclass(frozen=True)
class MatmulShape:
    """block_n / block_k / stages / num_warps of `_expert_mm_kernel`."""

    block_n: int
    block_k: int
    stages: int
    num_warps: int


@dataclass(frozen=True)
class MoETuning:
    """rows_16 / rows_32 / rows_64: the largest mean rows an expert (T * top_k / E) that takes
    blocks of 16 / 32 / 64 rows (128 above). decode: the launch shape at 16 rows a block (the
    memory-bound case: a narrow BLOCK_N so that the weight slabs spread over every SM); gated:
    the same for a silu_mul product (two weight tiles a step); wide: at 32 and 64 rows; wide128:
    at 128 rows (compute grows with the rows). Measurements: docs/kernels/moe.md (prefill:
    blocks of 128 rows at 128 x 64, 4 stages, 8 warps took a V2-Lite 2048-token chunk's expert
    layer from 804 to 705 us)."""

    rows_16: float = 16.0
    rows_32: float = 48.0
    rows_64: float = 96.0
    decode: MatmulShape = MatmulShape(block_n=64, block_k=128, stages=3, num_warps=2)
    gated: MatmulShape = MatmulShape(block_n=32, block_k=128, stages=4, num_warps=4)
    wide: MatmulShape = MatmulShape(block_n=128, block_k=64, stages=3, num_warps=4)
    wide128: MatmulShape = MatmulShape(block_n=128, block_k=64, stages=4, num_warps=8)

    @staticmethod
    def current() -> MoETuning:
        """The shipped tuning with $PAGEDATTN_MOE_TUNING's overrides (module docstring)."""
        over = env.tuning_overrides("MOE")
        if not over:
            return SHIPPED
        shapes = {k: MatmulShape(*v) for k, v in over.items() if isinstance(v, tuple)}
        return replace(SHIPPED, **{**over, **shapes})

    def block_m(self, num_rows: int, num_experts: int) -> int:
        mean = num_rows / max(1, num_experts)
        if mean <= self.rows_16:
            return 16
        return 32 if mean <= self.rows_32 else 64 if mean <= self.rows_64 else 128

    def matmul(self, block_m: int, w_block: tuple[int, int] | None, gated: bool = False
               ) -> MatmulShape:  # fmt: skip
        """The shape for blocks of `block_m` rows (gated: a silu_mul product); with FP8 blocks
        (n_gran, k_gran) BLOCK_K divides k_gran (one scale a chunk and column)."""
        if block_m <= 16:
            s = self.gated if gated else self.decode
        else:
            s = self.wide if block_m < 128 else self.wide128
        bk = s.block_k
        if w_block is not None:
            k_gran = w_block[1]
            while bk > 16 and k_gran % bk:
                bk //= 2
        return MatmulShape(s.block_n, bk, s.stages, s.num_warps)


SHIPPED = MoETuning()
