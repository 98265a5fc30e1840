"""Logging, by category, to stderr: DYNAMO_LOG=traces,guards,exits,recompiles,aborts,perf (or
`all`), or dynamo.config.log = {"traces", ...} (config wins when set). Quiet by default, except
the one warning line per function that reaches its cache limit."""
import os
import sys

from . import config

CATEGORIES = ("traces", "guards", "exits", "recompiles", "aborts", "perf")


def _enabled_set():
    chosen = config.log
    if chosen is None:
        env = os.environ.get("DYNAMO_LOG", "")
        chosen = {c.strip() for c in env.split(",") if c.strip()}
    chosen = set(chosen)
    if "all" in chosen:
        return set(CATEGORIES)
    return chosen & set(CATEGORIES)


def enabled(category):
    return category in _enabled_set()


def log(category, message):
    if enabled(category):
        print(f"dynamo[{category}]: {message}", file=sys.stderr)
