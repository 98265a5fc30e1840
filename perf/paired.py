"""Paired A/B timing of one zoo model in ONE process, for effects of a few percent.

On a machine whose speed drifts (this project's 2-core VM: the same call reads 1.5x apart within
minutes), two separate runs cannot show a 5% change. Here both settings run in the same process,
in alternating blocks of calls (the order flipped every other block), so the drift touches them
alike; the script prints each side's median block and in how many blocks B beat A.

  python perf/paired.py MODEL --config KNOB A B     two copies of the model, each optimized and
                                                    recorded under dynamo.config.KNOB = A or B
  python perf/paired.py MODEL --env VAR A B         one optimized model, VAR set to A or B before
                                                    each block (for settings the native code reads
                                                    on every call, such as DYNAMO_ATTENTION)

Values are Python literals where they parse (True, 0, 1.5), else strings. MODEL is a zoo name
(the rows of `make zoo`: resnet50, timm.vit_tiny_patch16_224, hf.bert, ...). Run it with nothing
else running: PYTHONPATH=python_shim DYNAMO_LIBRARY=build/libdynamo.so.0 .venv/bin/python
perf/paired.py hf.t5 --config keep_weight_results False True
"""
import argparse
import ast
import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--config", nargs=3, metavar=("KNOB", "A", "B"))
    group.add_argument("--env", nargs=3, metavar=("VAR", "A", "B"))
    ap.add_argument("--blocks", type=int, default=20, help="timed blocks per side (default 20)")
    ap.add_argument("--calls", type=int, default=8, help="timed calls per block (default 8)")
    args = ap.parse_args()

    import dynamo
    from dynamo import config
    models.setup_torch()
    fam = dict(models.list_models()).get(args.model)
    if fam is None:
        sys.exit(f"paired: unknown model {args.model!r}; zoo models: {', '.join(n for n, _ in models.list_models())}")
    model = models.build_model(args.model, fam, 64)
    inp = models.model_input(args.model, fam, 64)
    x = models.make_input(inp.kind, inp.shape, 0)

    def caller(fn):
        return (lambda: fn(*x)) if isinstance(x, tuple) else (lambda: fn(x))

    sides = {}  # label -> (call, before each block)
    with torch.no_grad():
        want = caller(model)()
        if args.config:
            knob, a, b = args.config
            old = getattr(config, knob)
            for label, value, m in ((f"{knob}={a}", literal(a), model), (f"{knob}={b}", literal(b), copy.deepcopy(model))):
                setattr(config, knob, value)
                call = caller(models.side_callable("dynamo", m))
                for _ in range(12):  # recorded and compiled under this setting, then warm
                    call()
                sides[label] = (call, lambda: None)
            setattr(config, knob, old)
        else:
            var, a, b = args.env
            call = caller(models.side_callable("dynamo", model))
            for _ in range(12):
                call()
            for value in (a, b):
                sides[f"{var}={value}"] = (call, lambda value=value: os.environ.__setitem__(var, value))
        for label, (call, before) in sides.items():
            before()
            got = call()
            if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor):
                scale = want.abs().max().item() or 1.0
                err = (got.float() - want.float()).abs().max().item() / scale
                print(f"{label}: max relative error vs eager {err:.1e}")
        times = {label: [] for label in sides}
        labels = list(sides)
        for blk in range(args.blocks):
            for label in (labels if blk % 2 == 0 else labels[::-1]):
                call, before = sides[label]
                before()
                call()
                call()
                ts = []
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    call()
                    ts.append(time.perf_counter() - t0)
                times[label].append(statistics.median(ts))
    a_lbl, b_lbl = labels
    a, b = times[a_lbl], times[b_lbl]
    wins = sum(1 for p, q in zip(a, b) if q < p)
    print(f"{args.model}: {a_lbl} {statistics.median(a) * 1e3:.3f} ms, {b_lbl} {statistics.median(b) * 1e3:.3f} ms "
          f"(median block); {b_lbl} faster in {wins} of {len(a)} blocks; A/B {statistics.median(a) / statistics.median(b):.3f}x")


if __name__ == "__main__":
    main()
