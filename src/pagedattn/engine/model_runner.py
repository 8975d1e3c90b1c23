"""`ModelRunner`: runs the model on one step's inputs and returns the logits rows.

`execute(inputs) -> logits` is the engine's one call. A pure decode step (every request one
new token, every one sampling) that the runner's `GraphRunner` serves replays the captured
CUDA graph of its batch-size bucket (`cuda_graphs.py`: the step's arrays copied into static
buffers, the batch padded, the lookup table at a fixed width); a step with prefill chunks that
the runner's `MixedGraphRunner` serves replays its token-count bucket's captured pieces, each
layer's attention eager between them (`mixed_graphs.py`); every other step, and every step of
a runner without graphs (`enforce_eager`, the CPU, a model that cannot be captured), is one
eager call of the model.

Tensor parallelism is SPMD: one process per rank, each with its own runner, model shard and
cache (its KV-head shard, so `inputs.kv_inputs[0]` is this rank's), fed the same step inputs;
the model's all-reduces make the logits equal on every rank (over NCCL, decode steps replay
graphs that capture them).
"""

from __future__ import annotations

import torch

from ..ops.mha import StepPlan
from .cuda_graphs import GraphRunner, takes_attention_plan, takes_num_decodes
from .mixed_graphs import MixedGraphRunner
from .step_inputs import StepInputs


class ModelRunner:
    """model: the step model (`models.DecoderForCausalLM.forward`'s signature) on `device`;
    a model whose forward takes `num_decodes` gets the step's (`StepInputs.num_decodes`).
    graphs: the decode graphs, or None (every step eager); mixed: the mixed steps' pieces, or
    None (those steps eager)."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        graphs: GraphRunner | None = None,
        mixed: MixedGraphRunner | None = None,
    ) -> None:
        self.model = model
        self.device = device
        self.graphs = graphs
        self.mixed = mixed
        self._takes_hint = takes_num_decodes(model)
        self._takes_plan = takes_attention_plan(model)

    @torch.inference_mode()
    def execute(self, inputs: StepInputs) -> torch.Tensor:
        """Logits [len(inputs.logits_rows), vocab] float32 of the step (row i for request
        `inputs.sample_index[i]`); after a graph replay, a view valid until the next call."""
        if self.graphs is not None and self.graphs.serves(inputs):
            return self.graphs.run(inputs)
        if self.mixed is not None and self.mixed.serves(inputs):
            return self.mixed.run(inputs)
        return self.eager(inputs)

    def greedy_tokens(self, inputs: StepInputs) -> torch.Tensor | None:
        """After `execute`: the greedy tokens of its logits ([n] int64) where the step's
        graph computed them (a staged decode step, `GraphRunner.greedy_tokens`), else None."""
        return None if self.graphs is None else self.graphs.greedy_tokens(inputs)

    @torch.inference_mode()
    def eager(self, inputs: StepInputs) -> torch.Tensor:
        """The step as one eager model call (what `execute` does without a graph)."""
        hint = {"num_decodes": inputs.num_decodes} if self._takes_hint else {}
        if self._takes_plan:  # the step's plan, from the manager's host lengths (`mha`)
            hint["attention_plan"] = StepPlan(inputs.host.cache_lengths)
        return self.model(
            inputs.input_ids,
            inputs.positions,
            inputs.kv_inputs[0],
            inputs.q_row_offsets,
            inputs.logits_rows,
            **hint,
        )


__all__ = ["ModelRunner"]
