"""Finds the package's native extensions (_evalframe, _fastcall): next to this file when
installed, in build/python of a source checkout after `make` (or beside $DYNAMO_LIBRARY)."""
import importlib.machinery
import importlib.util
import os

_loaded = {}


def load(name):
    if name in _loaded:
        return _loaded[name]
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = [here, os.path.join(here, "..", "..", "build", "python")]
    lib = os.environ.get("DYNAMO_LIBRARY")
    if lib:
        dirs.insert(0, os.path.join(os.path.dirname(lib), "python"))
    for d in dirs:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES[:1]:  # (only this version's: .cpython-3XY-...so)
            path = os.path.join(d, name + suffix)
            if os.path.exists(path):
                spec = importlib.util.spec_from_file_location("dynamo." + name, path)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                _loaded[name] = mod
                return mod
    raise ImportError(f"dynamo: the extension {name} was not found in " +
                      ", ".join(os.path.normpath(d) for d in dirs) +
                      ". Install the package (pip install .) or run `make` in the source tree (it builds build/python/).")
