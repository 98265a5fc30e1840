"""Logging, by category, to stderr: DYNAMO_LOG=traces,guards,exits,recompiles,aborts,perf,store (or
`all`), or dynamo.config.log = {"traces", ...} (config wins when set). Quiet by default, except
the one warning line per function that reaches its cache limit."""
import os
import sys

from . import config

CATEGORIES = config.LOG_CATEGORIES


_memo = (None, None, frozenset())  # (config.log, $DYNAMO_LOG) -> categories: checks on hot paths are cheap


def _enabled_set():
    global _memo
    key = (frozenset(config.log) if config.log is not None else None, os.environ.get("DYNAMO_LOG", ""))
    if key[:2] == _memo[:2]:
        return _memo[2]
    chosen = config.log
    if chosen is None:
        env = os.environ.get("DYNAMO_LOG", "")
        chosen = {c.strip() for c in env.split(",") if c.strip()}
        for c in sorted(chosen - set(CATEGORIES) - {"all"}):  # said once per value of $DYNAMO_LOG
            print("dynamo: DYNAMO_LOG " + config.unknown(c, CATEGORIES + ("all",), "category list") +
                  " (ignored)", file=sys.stderr)
    chosen = set(chosen)
    result = frozenset(CATEGORIES) if "all" in chosen else frozenset(chosen & set(CATEGORIES))
    _memo = (key[0], key[1], result)
    return result


def enabled(category):
    return category in _enabled_set()


def log(category, message):
    if enabled(category):
        print(f"dynamo[{category}]: {message}", file=sys.stderr)
