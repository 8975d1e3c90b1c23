"""`ModelRunner`: runs the model on one step's inputs and returns the logits rows.

Today one eager call on one device. The seams for what comes next live here, behind
`execute(inputs) -> logits`: CUDA graphs (decode batches padded to a captured size, the step's
arrays copied into static buffers, `padded_cols` fixed) and tensor parallelism (one runner per
rank over torch.distributed, each fed the same step inputs, `inputs.kv_inputs[rank]`).
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
