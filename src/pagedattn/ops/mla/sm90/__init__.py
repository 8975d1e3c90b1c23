"""Gluon MLA decode kernels for sm_90 (Hopper): wgmma, TMA / cp.async rings, warp
specialization. `ops.mla.triton_mla` chooses among them; every other device (and every case
these do not serve) runs the portable Triton kernel."""
