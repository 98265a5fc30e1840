"""Where a zoo model's time goes, dynamo beside torch.compile (Inductor), per op family.

    PYTHONPATH=python_shim DYNAMO_LIBRARY=build/libdynamo.so.0 .venv/bin/python perf/profile_families.py \
        --models resnet50,timm.poolformer_s12,hf.bert [--calls 20] [--top 10]

Each side runs in a process of its own (the zoo's models, inputs, threads and Inductor settings,
perf/models.py), warms up, then times `calls` calls and profiles the same number again:
  dynamo   with DYNAMO_PROFILE=1: the time of every step of every compiled trace (kernels,
           LibTorch calls, exit checks), and the rest of each call (guards, Python between parts,
           anything run eagerly) as the call's wall time less the compiled code's;
  inductor torch.profiler over torch.compile's calls (its C++ kernels named with
           torch._inductor.config.cpp.enable_kernel_profile), each event's self time.
Both are sorted into families -- convolution, matmul (mm/addmm/bmm/linear), attention, pooling,
fused kernels (dynamo's own; Inductor's cpp_fused_*), other ops, and outside (Python, guards,
wrappers) -- and printed in ms per call side by side, with each side's wall time per call.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILY_ORDER = ("convolution", "matmul", "attention", "pooling", "fused kernels", "other ops", "outside")


def family(name):
    n = name.lower()
    if "conv" in n:
        return "convolution"
    if any(k in n for k in ("attention", "sdpa", "flash")):
        return "attention"
    if any(k in n for k in ("aten::mm", "addmm", "bmm", "linear", "matmul", "gemm", "aten::mm ", "mkl_")) or \
            n.startswith("extern aten::mm"):
        return "matmul"
    if "pool" in n:
        return "pooling"
    if n.startswith("kernel") or n.startswith("row kernel") or "cpp_fused" in n or "side exit" in n:
        return "fused kernels"
    return "other ops"


def _entries():
    import importlib
    explain = importlib.import_module("dynamo.explain")
    from dynamo import registry
    out = {}
    for f in registry.functions():
        for _, c in explain._profiled_traces(f):
            p = c.entry.profile()
            if p is None:
                continue
            for i, runs, ns, what in p[2]:
                out[(id(c), i)] = (runs, ns, what)
    return out


def child(name, side, calls):
    sys.path.insert(0, HERE)
    import models
    import torch
    models.setup_torch()
    fam = dict(models.list_models())[name] if name in dict(models.list_models()) else None
    size = 64
    model = models.build_model(name, fam, size)
    inp = models.model_input(name, fam, size)
    x = models.make_input(inp.kind, inp.shape, 0)
    fn = models.side_callable("dynamo" if side == "dynamo" else "compile", model)
    if side == "inductor":
        import torch._inductor.config as inductor
        inductor.cpp.enable_kernel_profile = True

    def call():
        return fn(*x) if isinstance(x, tuple) else fn(x)
    with torch.no_grad():
        for _ in range(10):  # (compiles, and each side's first calls time their choices)
            call()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        wall = (time.perf_counter() - t0) / calls * 1e3
        fams = dict.fromkeys(FAMILY_ORDER, 0.0)
        names = {}  # op or step name -> ms per call (the --top list)
        if side == "dynamo":
            before = _entries()
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            profiled_wall = (time.perf_counter() - t0) / calls * 1e3
            code = 0.0
            for k, (runs, ns, what) in _entries().items():
                d = (ns - before.get(k, (0, 0, ""))[1]) / 1e6 / calls
                fams[family(what)] += d
                names[what] = names.get(what, 0.0) + d
                code += d
            fams["outside"] = max(0.0, profiled_wall - code)
        else:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                t0 = time.perf_counter()
                for _ in range(calls):
                    call()
                profiled_wall = (time.perf_counter() - t0) / calls * 1e3
            inside = 0.0
            for ev in prof.key_averages():
                ms = ev.self_cpu_time_total / 1e3 / calls
                key = ev.key
                if key.startswith("aten::") or "cpp_fused" in key or "mkldnn" in key or "mkl" in key or \
                        key.startswith("torch_ops::") or key.startswith("inductor::"):
                    fams[family(key)] += ms
                    names[key] = names.get(key, 0.0) + ms
                    inside += ms
            fams["outside"] = max(0.0, profiled_wall - inside)
    top = sorted(names.items(), key=lambda kv: -kv[1])[:50]
    print("@profile " + json.dumps({"wall": wall, "families": fams, "top": top}), flush=True)


def run_side(name, side, calls):
    env = dict(os.environ)
    if side == "dynamo":
        env["DYNAMO_PROFILE"] = "1"
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, side, str(calls)],
                       capture_output=True, text=True, env=env, timeout=1800)
    line = next((s for s in r.stdout.splitlines() if s.startswith("@profile ")), None)
    if line is None:
        print(f"  {side}: failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:] }")
        return None
    return json.loads(line[len("@profile "):])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--top", type=int, default=0, help="also list each side's N costliest ops or steps")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], int(args.child[2]))
    for name in args.models.split(","):
        d, i = run_side(name, "dynamo", args.calls), run_side(name, "inductor", args.calls)
        if d is None or i is None:
            continue
        print(f"{name}: wall per call dynamo {d['wall']:.2f} ms, torch.compile {i['wall']:.2f} ms "
              f"({i['wall'] / d['wall']:.2f}x); ms per call by family (profiled calls):")
        print(f"  {'family':<15} {'dynamo':>9} {'inductor':>9}")
        for fam in FAMILY_ORDER:
            a, b = d["families"][fam], i["families"][fam]
            if a or b:
                print(f"  {fam:<15} {a:9.3f} {b:9.3f}{'   <-- dynamo slower by %.2f ms' % (a - b) if a - b > 0.2 else ''}")
        for side, r in (("dynamo", d), ("inductor", i)) if args.top else ():
            print(f"  {side}'s costliest (ms per call):")
            for what, ms in r["top"][:args.top]:
                print(f"    {ms:8.3f}  {what[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
