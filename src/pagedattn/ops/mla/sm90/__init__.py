"""Gluon MLA decode kernels for sm_90 (Hopper): wgmma, TMA / cp.async rings, warp
specialization. `ops.mla.triton_mla_plan` chooses among them; every other device (and every case
these do not serve) runs the portable Triton kernel. Each module's design history and
measurements: docs/kernels/<module>.md."""
