"""A stand-in for the one ``kubectl`` command seed 001 runs to fill in a runner configuration:

    kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' --raw

It reads ``$KUBECONFIG`` (one file), keeps the current context's cluster and user (``--minify``) and prints
the value at the JSONPath, as kubectl does; without ``--raw`` the ``*-data`` values print as kubectl prints
them (``DATA+OMITTED``). Anything else exits 1 saying it is not supported. It exists because ``kubectl`` is
not installable from the package registries this project's machines reach; ``test_seed_examples`` checks it
against the real ``kubectl`` where one is installed.

Run as ``python kubectl_standin.py config view ...``.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import yaml

_SEGMENT = re.compile(r"\.([A-Za-z0-9_-]+)(?:\[(\d+)\])?")


def _minified(config: dict[str, Any]) -> dict[str, Any]:
    context_name = config.get("current-context")
    context = next(c["context"] for c in config.get("contexts", []) if c["name"] == context_name)
    return {
        **config,
        "clusters": [c for c in config.get("clusters", []) if c["name"] == context["cluster"]],
        "users": [u for u in config.get("users", []) if u["name"] == context["user"]],
        "contexts": [c for c in config["contexts"] if c["name"] == context_name],
    }


def _redacted(config: dict[str, Any]) -> dict[str, Any]:
    for entry in (*config["clusters"], *config["users"]):
        values = entry.get("cluster") or entry.get("user") or {}
        for key in list(values):
            if key.endswith("-data"):
                values[key] = "DATA+OMITTED"
    return config


def _jsonpath(data: Any, expression: str) -> str:
    match = re.fullmatch(r"\{(.*)\}", expression)
    if match is None:
        raise SystemExit(f"kubectl stand-in: unsupported JSONPath {expression!r}")
    node = data
    for name, index in _SEGMENT.findall(match.group(1)):
        node = node.get(name) if isinstance(node, dict) else None
        if index and isinstance(node, list):
            node = node[int(index)] if int(index) < len(node) else None
        if node is None:
            return ""
    return str(node)


def main(argv: list[str]) -> int:
    args = list(argv)
    raw = "--raw" in args
    minify = "--minify" in args
    output = next((a.removeprefix("jsonpath=") for a in args if a.startswith("jsonpath=")), None)
    known = {"config", "view", "--minify", "--raw", "-o", f"jsonpath={output}"}
    if args[:2] != ["config", "view"] or output is None or not set(args) <= known:
        print(
            f"kubectl stand-in: only 'config view [--minify] -o jsonpath=... [--raw]', not {args}",
            file=sys.stderr,
        )
        return 1
    with open(os.environ["KUBECONFIG"], encoding="utf-8") as file:
        config = yaml.safe_load(file)
    if minify:
        config = _minified(config)
    if not raw:
        config = _redacted(config)
    sys.stdout.write(_jsonpath(config, output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
