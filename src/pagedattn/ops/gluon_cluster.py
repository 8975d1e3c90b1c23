"""Two-CTA clusters (sm_90 distributed shared memory) for Gluon kernels compiled as one CTA.

Gluon (Triton 3.6) has no cluster API short of `num_ctas`, which makes every layout span the
cluster. These kernels are compiled as ordinary one-CTA programs and launched in clusters of
two (`ops.launch.launch(..., cluster=2)`); the cross-CTA steps are inline PTX on shared
addresses, which a kernel takes as runtime arguments: the offsets of its allocations from
`global_smem`, read from its compiled TTGIR by `smem_offsets` (Triton's own shared-memory
allocation pass, run again on that module) and filled in by `launch(..., smem_args=...)`.

Device helpers (every thread calls them; the one-thread steps pick thread 0 of each 128-thread
warpgroup):
- `cl_arrive` / `cl_wait`: the cluster barrier's two halves (every thread of both CTAs
  arrives once a phase, then waits); `cl_sync`: both;
- `cl_remote_arrive(off, peer)`: one arrival on the mbarrier at `off` in CTA `peer`;
- `cl_copy_to_peer(src, bar, nbytes, peer)`: a bulk copy of nbytes of this CTA's shared memory
  at `src` to the same offset in CTA `peer`, completing nbytes of transactions on the peer's
  mbarrier at `bar` (the source's generic-proxy stores must be fenced first).
"""

from __future__ import annotations

import os
import re
import tempfile

from .gluon_imports import HAS_GLUON, gl, gluon


def smem_offsets(ttgir: str, names: tuple[str, ...], capability: int = 90) -> dict[str, int]:
    """Offsets (bytes from `global_smem`) of the named `ttg.local_alloc`s of a compiled Gluon
    kernel (its `asm["ttgir"]`): Triton's shared-memory allocation pass run on that module.
    Raises KeyError naming an allocation that is not there."""
    from triton._C.libtriton import ir, nvidia, passes

    ctx = ir.context()
    ir.load_dialects(ctx)
    nvidia.load_dialects(ctx)
    fd, path = tempfile.mkstemp(suffix=".ttgir")  # the binding parses files only
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(ttgir)
        mod = ir.parse_mlir_module(path, ctx)
    finally:
        os.unlink(path)
    mod.context = ctx
    pm = ir.pass_manager(ctx)
    passes.ttgpuir.add_combine_tensor_select_and_if(pm)
    passes.ttgpuir.add_allocate_warp_groups(pm)
    passes.convert.add_scf_to_cf(pm)
    passes.gluon.add_inliner(pm)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(pm, capability, 86)
    pm.run(mod, "smem_offsets")
    found = {
        m.group(1): int(m.group(2))
        for m in re.finditer(
            r"%(\w+) = ttg\.local_alloc \{allocation\.offset = (\d+) : i32\}", str(mod)
        )
    }
    missing = [n for n in names if n not in found]
    if missing:
        raise KeyError(f"shared allocations {missing} not in the kernel (found {sorted(found)})")
    return {n: found[n] for n in names}


if HAS_GLUON:

    @gluon.jit
    def _cl_op(ASM: gl.constexpr):
        """Every thread: one PTX statement with no operands."""
        gl.inline_asm_elementwise(
            ASM + " mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1
        )

    @gluon.jit
    def cl_arrive():
        """Every thread: arrive on the cluster barrier (release: its shared-memory writes and
        mbarrier initializations are seen by the peer after its `cl_wait`)."""
        _cl_op("barrier.cluster.arrive.release;")

    @gluon.jit
    def cl_wait():
        """Every thread: wait until every thread of the cluster has arrived (acquire)."""
        _cl_op("barrier.cluster.wait.acquire;")

    @gluon.jit
    def cl_sync():
        """Every thread: `cl_arrive`, then `cl_wait`."""
        cl_arrive()
        cl_wait()

    @gluon.jit
    def cl_fence_init():
        """Make this CTA's mbarrier initializations visible to the cluster."""
        _cl_op("fence.mbarrier_init.release.cluster;")

    @gluon.jit
    def _cl_peer_addr(off, peer):
        """The shared::cluster address of shared offset `off` in CTA `peer` (int32)."""
        return gl.inline_asm_elementwise(
            "{ .reg .u32 a; mov.u32 a, global_smem; add.u32 a, a, $1;"
            " mapa.shared::cluster.u32 $0, a, $2; }",
            "=r,r,r",
            [off, peer],
            dtype=gl.int32,
            is_pure=True,
            pack=1,
        )

    @gluon.jit
    def cl_remote_arrive(off, peer):
        """Thread 0 of each warpgroup: one arrival on the mbarrier at shared offset `off` of
        CTA `peer`. Relaxed: it orders none of the thread's memory accesses (a release at
        cluster scope costs a MEMBAR.ALL.GPU first), so it may only signal that reads already
        complete (a wgmma's, waited for) are done."""
        gl.inline_asm_elementwise(
            """{
            .reg .u32 t;
            .reg .pred p;
            mov.u32 t, %tid.x;
            and.b32 t, t, 127;
            setp.eq.u32 p, t, 0;
            @p mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [$1];
            mov.u32 $0, 0;
            }""",
            "=r,r",
            [_cl_peer_addr(off, peer)],
            dtype=gl.int32,
            is_pure=False,
            pack=1,
        )

    @gluon.jit
    def cl_copy_to_peer(src, bar, nbytes, peer):
        """Thread 0 of each warpgroup: bulk-copy nbytes (a multiple of 16) of shared memory at
        offset `src` to offset `src` of CTA `peer`, completing nbytes of transactions on that
        CTA's mbarrier at offset `bar`."""
        gl.inline_asm_elementwise(
            """{
            .reg .u32 s, t;
            .reg .pred p;
            mov.u32 t, %tid.x;
            and.b32 t, t, 127;
            setp.eq.u32 p, t, 0;
            mov.u32 s, global_smem;
            add.u32 s, s, $1;
            @p cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes
                [$2], [s], $4, [$3];
            mov.u32 $0, 0;
            }""",
            "=r,r,r,r,r",
            [src, _cl_peer_addr(src, peer), _cl_peer_addr(bar, peer), nbytes],
            dtype=gl.int32,
            is_pure=False,
            pack=1,
        )
