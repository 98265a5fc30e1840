"""python -m dynamo [--report] SCRIPT.py [ARGS...]

Runs an unmodified script with the JIT on: every Python function it calls with tensors (or
nn.Modules) may be recorded and compiled (the `with dynamo.optimize():` frame hook). With
--report, prints afterwards what was compiled, what fell back, and why.
"""
import argparse
import os
import runpy
import sys


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dynamo",
                                description="Run a PyTorch script with the dynamo JIT on.")
    p.add_argument("--report", action="store_true", help="print what was compiled and what fell back")
    p.add_argument("--nopython", action="store_true", help="raise instead of falling back to eager")
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    ns = p.parse_args(argv)
    if not os.path.isfile(ns.script):
        p.error(f"no such script: {ns.script}")
    import dynamo

    sys.argv = [ns.script] + ns.args
    sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))
    try:
        with dynamo.optimize(nopython=ns.nopython):
            runpy.run_path(ns.script, run_name="__main__")
    finally:
        if ns.report:
            print("\n== dynamo report ==\n" + dynamo.report(), file=sys.stderr)
            if not dynamo.counters()["calls"]:
                print("dynamo: nothing was compiled: no function of the script (nor an nn.Module called "
                      "from its top level) ran with tensor or module arguments. Tensor code written at "
                      "the top level itself runs in CPython: move it into a function.", file=sys.stderr)


if __name__ == "__main__":
    main()
