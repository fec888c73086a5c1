"""Where a cold runner's CPU goes: a small burst on the local launcher with every runner a fresh
`po-runner standard` process (`PO_LOCAL_ZYGOTE=off`, no warm runners), each reading its own CPU time
(`getrusage`) at the steps of its life, and optionally profiling its imports.

    uv run python bench/runner_cpu.py [--deployments 12] [--imports 25] [--json]

How: the runner configuration's `job.environment` puts a directory of this script's on the runners'
`PYTHONPATH` holding a `sitecustomize.py` (Python imports it at start-up, before the runner's own code);
it notes the process's CPU seconds when the interpreter is up, when `run_standard` is called (the imports
are done), around the gateway client's construction, when `run_standard` returns and at exit, and with
`--imports N` profiles the import phase with `cProfile` on thread CPU time (the profiler slows it; the
shares are what to read). The engine (`po-terraform`, also Python) ignores it. Results: a table of the
phases (mean CPU seconds per runner) and the top N modules by cumulative import time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pstats
import sys
import tempfile
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import burst
import httpx

#: What the runners load at start-up: CPU marks (and the import profile) written to OUT/<pid>.*.
SITECUSTOMIZE = textwrap.dedent(
    """
    import atexit, importlib.abc, importlib.machinery, os, resource, sys, time
    OUT, PROFILE = os.environ["BENCH_RUNNER_CPU_OUT"], os.environ.get("BENCH_RUNNER_CPU_PROFILE") == "1"

    def _cpu():
        used = resource.getrusage(resource.RUSAGE_SELF)
        return used.ru_utime + used.ru_stime

    if "orchestrator.cli.runner" in " ".join(sys.orig_argv):
        marks = [("interpreter up", _cpu())]
        profile = None
        if PROFILE:
            import cProfile
            profile = cProfile.Profile(time.thread_time)
            profile.enable()

        class _Hooks(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name not in ("orchestrator.runner.standard", "orchestrator.runner.gateway_client"):
                    return None
                spec = importlib.machinery.PathFinder.find_spec(name, path, target)
                loaded = spec.loader.exec_module

                def exec_module(module):
                    loaded(module)
                    if name == "orchestrator.runner.standard":
                        run = module.run_standard

                        def run_standard(*args, **kwargs):
                            if profile is not None:
                                profile.disable()
                            marks.append(("imports done", _cpu()))
                            try:
                                return run(*args, **kwargs)
                            finally:
                                marks.append(("run done", _cpu()))

                        module.run_standard = run_standard
                    else:
                        made = module.GatewayClient.__init__

                        def __init__(self, *args, **kwargs):
                            before = _cpu()
                            made(self, *args, **kwargs)
                            marks.append(("gateway client (its cost)", _cpu() - before))

                        module.GatewayClient.__init__ = __init__

                spec.loader.exec_module = exec_module
                return spec

        sys.meta_path.insert(0, _Hooks())

        def _write():
            marks.append(("exit", _cpu()))
            with open(f"{OUT}/{os.getpid()}.marks", "w") as out:
                out.write("\\n".join(f"{k}\\t{v}" for k, v in marks))
            if profile is not None:
                profile.dump_stats(f"{OUT}/{os.getpid()}.prof")

        atexit.register(_write)
    """
)


def run(deployments: int, imports: int) -> dict[str, Any]:
    options = burst.parse_options(
        ["--only", "burst", "--deployments", str(deployments), "--local-runs", "cold", "--floor-runs", "1"]
    )
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="po-bench-runner-cpu-")))
        tmp.chmod(0o755)
        hooks, out = tmp / "hooks", tmp / "out"
        hooks.mkdir()
        out.mkdir(mode=0o777)
        (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
        (tmp / "terraformrc").touch()
        engine_env = {
            "IAC_BACKEND": "embedded",
            "TF_CLI_CONFIG_FILE": str(tmp / "terraformrc"),
            "CHECKPOINT_DISABLE": "1",
            "PYTHONPATH": str(hooks),
            "BENCH_RUNNER_CPU_OUT": str(out),
            "BENCH_RUNNER_CPU_PROFILE": "1" if imports else "0",
        }
        token = "po_bench_" + os.urandom(16).hex()
        servers, postmaster = stack.enter_context(burst.serving(tmp, "sqlite", token, options, "cold"))
        client = stack.enter_context(httpx.Client(base_url=servers[0].base_url, timeout=60))
        burst.set_up(client, token, options, engine_env)
        result = burst.burst(client, servers, postmaster, options)
        phases: dict[str, list[float]] = defaultdict(list)
        for marks in out.glob("*.marks"):
            for line in marks.read_text().splitlines():
                name, value = line.split("\t")
                phases[name].append(float(value))
        top: list[tuple[str, float]] = []
        profiles = [str(p) for p in out.glob("*.prof")]
        if profiles:
            stats = pstats.Stats(*profiles)
            found = [
                (func, entry[3] / len(profiles))
                for func, entry in stats.stats.items()  # type: ignore[attr-defined]
                if func[2] == "<module>"
            ]
            found.sort(key=lambda item: -item[1])
            top = [
                (func[0].split("site-packages/")[-1].split("src/")[-1], cum) for func, cum in found[:imports]
            ]
    return {
        "runners": len(phases.get("exit", [])),
        "succeeded": result["succeeded"],
        "mean_cpu_s": {name: round(sum(values) / len(values), 4) for name, values in phases.items()},
        "bench_cpu_s_per_deployment": result["cpu_s_per_deployment"],
        "import_profile_cum_s": top,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--deployments", type=int, default=12, help="cold runs measured (default 12)")
    parser.add_argument(
        "--imports", type=int, default=0, help="profile the imports: top N modules (default off)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    result = run(args.deployments, args.imports)
    result["load_average_before_after"] = [load_before, os.getloadavg()]
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    cpu = result["mean_cpu_s"]
    up, imported, done, left = (
        cpu.get(k, 0.0) for k in ("interpreter up", "imports done", "run done", "exit")
    )
    print(
        f"{result['runners']} cold runners ({result['succeeded']} deployments succeeded); CPU-s per runner:"
    )
    rows = [
        ("interpreter start (to site-customize)", up),
        ("imports (to run_standard)", imported - up),
        ("the run (run_standard)", done - imported),
        ("  of it: the gateway client's construction", cpu.get("gateway client (its cost)", 0.0)),
        ("exit", left - done),
        ("total", left),
    ]
    for name, value in rows:
        print(f"  {name:<45} {value:6.3f}  {100 * value / left if left else 0:5.1f} %")
    if result["import_profile_cum_s"]:
        print("imports, cumulative (profiled, so slowed; read the shares):")
        for module, seconds in result["import_profile_cum_s"]:
            print(f"  {seconds:6.3f}  {module}")
    before, after = ("/".join(f"{v:.2f}" for v in load) for load in result["load_average_before_after"])
    print(f"load average (1/5/15 min) before {before}, after {after}")
    return 0 if result["succeeded"] == args.deployments else 1


if __name__ == "__main__":
    sys.exit(main())
