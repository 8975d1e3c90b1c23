"""`ModelRunner`: runs the model on one step's inputs and returns the logits rows.

Today one eager call on one device. Tensor parallelism is SPMD: one process per rank, each
with its own runner, model shard and cache (its KV-head shard, so `inputs.kv_inputs[0]` is this
rank's), fed the same step inputs; the model's all-reduces make the logits equal on every rank.
The seam for CUDA graphs lives here, behind `execute(inputs) -> logits` (decode batches padded
to a captured size, the step's arrays copied into static buffers, `padded_cols` fixed).
"""

from __future__ import annotations

import torch

from .step_inputs import StepInputs


class ModelRunner:
    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device

    @torch.inference_mode()
    def execute(self, inputs: StepInputs) -> torch.Tensor:
        """Logits [len(inputs.logits_rows), vocab] float32 of the step."""
        return self.model(
            inputs.input_ids,
            inputs.positions,
            inputs.kv_inputs[0],
            inputs.q_row_offsets,
            inputs.logits_rows,
        )


__all__ = ["ModelRunner"]
