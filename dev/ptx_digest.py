"""Digest of the sm_90 PTX of every kernel specialization the GPU tests launch, for checking
that a change leaves the generated code instruction-for-instruction identical.

Cases come from `tests/sm90_compile.py` (the same enumeration `test_sm90_compile` uses); each
launch of each case is specialized as on an H100 (`pagedattn.ops.offline.specialize`) and
lowered through Triton's stages up to PTX (no ptxas). The PTX is normalized (line-info
directives and their labels, comments and debug sections dropped, so a moved source line or an
inlined helper changes nothing) and hashed. Output: one JSON object
{case: [[kernel name, sha256], ...]} written to OUT.

    python dev/ptx_digest.py OUT.json [dense|sparse|persistent|pages|mha|layers ...]
        [-j N] [-k TEXT]
    python dev/ptx_digest.py --compare BASE.json NEW.json [--subset]

-k TEXT keeps the cases whose name contains TEXT (repeat -k: all of them). --subset compares
only the cases NEW.json has (a -k run against a full baseline).

Run it from the root of each of two checkouts (with that checkout's src/ on PYTHONPATH) and
compare the files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor

# Labels that only the line info refers to (branch targets are $L__BB...): an inlined helper
# adds one where its body starts.
_DEBUG_LABEL = re.compile(r"^\$L__tmp\d+:$")


def normalize(ptx: str) -> str:
    """PTX without line-info, comments and debug sections."""
    out, in_debug = [], False
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith(".section"):
            in_debug = ".debug" in s
            continue
        if in_debug:
            if s == "}":
                in_debug = False
            continue
        if not s or s.startswith((".loc", ".file", "//")) or _DEBUG_LABEL.match(s):
            continue
        out.append(re.sub(r"\s+//.*$", "", line.rstrip()))
    return "\n".join(out)


def _ptx(launch) -> str:
    from triton._C.libtriton import ir

    from pagedattn.ops import offline

    src, options = offline.specialize(launch)
    target, backend = offline._backend()
    opts = offline._options(src, options)
    stages: dict = {}
    backend.add_stages(stages, opts, src.language)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(
        target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), context
    )
    metadata = {"target": target, **opts.__dict__}
    for ext, compile_ir in stages.items():
        if ext == "ttir" and src.ext == "ttgir":
            continue
        module = compile_ir(module, metadata)
        if ext == "ptx":
            return module
    raise RuntimeError("no ptx stage")


def _cases(modes, keep):
    import sm90_compile as S

    for mode in modes:
        cases_of = {"mha": S.mha_cases, "layers": S.layer_cases}.get(mode)
        for case, launches in cases_of() if cases_of else S.mla_cases(mode):
            if all(k in case for k in keep):
                yield case, launches


def _work(args):
    """Every worker walks every case (capturing and specializing its launches is cheap) and
    compiles the distinct specializations whose key falls in its shard, so none is compiled
    twice. -> ({case: [[kernel, key], ...]}, {key: digest})."""
    modes, keep, shard, nshard = args
    from pagedattn.ops import offline

    cases, digests = {}, {}
    for case, launches in _cases(modes, keep):
        row = []
        for launch in launches():
            src, opts = offline.specialize(launch)
            key = f"{launch.name}|{src.hash()}|{json.dumps(opts, default=str, sort_keys=True)}"
            mine = int(hashlib.sha1(key.encode()).hexdigest(), 16) % nshard == shard
            if mine and key not in digests:
                try:
                    digests[key] = hashlib.sha256(normalize(_ptx(launch)).encode()).hexdigest()
                except Exception as e:  # noqa: BLE001 - recorded
                    digests[key] = f"error: {type(e).__name__}: {str(e)[-200:]}"
            row.append([launch.name, key])
        cases[case] = row
    return cases, digests


def main(argv):
    if argv and argv[0] == "--compare":
        a, b = (json.load(open(p)) for p in argv[1:3])
        names = set(b) if "--subset" in argv else set(a) | set(b)
        diff = [c for c in sorted(names) if a.get(c) != b.get(c)]
        for c in diff[:20]:
            print("DIFF", c, a.get(c), b.get(c))
        n = sum(len(b[c]) for c in names if c in b)
        print(f"{len(names)} cases compared, {n} launches; {len(diff)} differ")
        return 1 if diff else 0
    out, rest = argv[0], argv[1:]
    jobs = 2
    if "-j" in rest:
        jobs = int(rest[rest.index("-j") + 1])
        del rest[rest.index("-j") : rest.index("-j") + 2]
    keep = []
    while "-k" in rest:
        i = rest.index("-k")
        keep.append(rest[i + 1])
        del rest[i : i + 2]
    modes = rest or ["dense", "sparse", "persistent", "pages", "mha"]
    sys.path.insert(0, os.path.join(os.getcwd(), "tests"))  # the checkout run from
    cases, digests = {}, {}
    with ProcessPoolExecutor(jobs) as ex:
        for c, d in ex.map(_work, [(modes, keep, s, jobs) for s in range(jobs)]):
            cases.update(c)
            digests.update(d)
    res = {case: [[name, digests[key]] for name, key in row] for case, row in cases.items()}
    json.dump(res, open(out, "w"), indent=0, sort_keys=True)
    errs = sum(1 for v in res.values() for _, h in v if h.startswith("error"))
    n = sum(len(v) for v in res.values())
    print(f"{len(res)} cases, {n} launches, {len(digests)} distinct specializations, {errs} errors")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
