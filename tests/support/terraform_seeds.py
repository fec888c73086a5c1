"""The Terraform ("TF" tab) blocks of seeds 000 and 001, and the fixture files that copy them verbatim.

`seed_blocks` finds each block in a seed's text: a run of lines from ``resource ...``, ``data ...`` or a
``  runner_configuration = {`` fragment to the line that closes its braces, with resources that follow
after blank lines only (one tab, as the basic example's runner and rule) in the same block. `FIXTURES`
names the file of ``tests/data/terraform`` that holds each block, in the seed's order.
"""

from __future__ import annotations

import os
from pathlib import Path

FIXTURES_DIR = Path(__file__).parents[1] / "data" / "terraform"
REPOSITORY = Path(__file__).parents[2]

_STARTS = ("resource ", "data ", "  runner_configuration = {")

#: Seed file prefix -> the fixture file of each of its TF blocks, in order.
FIXTURES: dict[str, tuple[str, ...]] = {
    "000": (
        "seed000_gke_runner_and_rule.tf",
        "seed000_kubernetes_agent_runner.tf",
        "seed000_custom_image_pod_template.tf",
        "seed000_ecs_custom_image.tf",
    ),
    "001": (
        "seed001_state_storage_placeholder.tf",
        "seed001_verify_placeholder.tf",
        "seed001_secret_env_pod_template.tf",
    ),
}


def seed_blocks(text: str) -> list[str]:
    """Each TF block of a seed's text, as it stands there (ending with its last line's newline)."""
    lines = text.split("\n")
    blocks: list[str] = []
    index = 0
    while index < len(lines):
        if not lines[index].startswith(_STARTS):
            index += 1
            continue
        start, depth = index, 0
        while index < len(lines):
            depth += lines[index].count("{") - lines[index].count("}")
            index += 1
            if depth != 0:
                continue
            following = index
            while following < len(lines) and lines[following] == "":
                following += 1
            if following < len(lines) and lines[following].startswith(("resource ", "data ")):
                index = following
                continue
            break
        blocks.append("\n".join(lines[start:index]) + "\n")
    return blocks


def seeds_dir() -> Path | None:
    """The project's seeds (``shared/seeds`` beside the repository, or ``$PO_SEEDS_DIR``), if present."""
    candidates = [Path(os.environ["PO_SEEDS_DIR"])] if os.environ.get("PO_SEEDS_DIR") else []
    candidates += [parent / "shared" / "seeds" for parent in REPOSITORY.parents]
    return next((path for path in candidates if any(path.glob("000_*.txt"))), None)


def seed_text(directory: Path, prefix: str) -> str:
    (path,) = sorted(directory.glob(f"{prefix}_*.txt"))
    return path.read_text(encoding="utf-8")


def fixture(name: str) -> str:
    return (FIXTURES_DIR / name).read_text(encoding="utf-8")


#: The seeds' blocks a lifecycle configuration applies as they stand (in its root module).
WHOLE_BLOCKS = ("seed000_gke_runner_and_rule.tf", "seed000_kubernetes_agent_runner.tf")
#: Fragments (``  runner_configuration = {...}``), each completed by ``<name>.completion.tf``.
FRAGMENTS = (
    "seed000_custom_image_pod_template.tf",
    "seed000_ecs_custom_image.tf",
    "seed001_secret_env_pod_template.tf",
)
#: Files of ours the lifecycle configuration adds to the root module.
OURS = ("lifecycle_fragments.tf", "ours_aks_vm_runners.tf", "data_sources.tf")

#: A module's own provider requirement (a child module does not inherit the root's source address).
MODULE_VERSIONS = """terraform {
  required_providers {
    platform-orchestrator = {
      source = "stellwerk-labs/platform-orchestrator"
    }
  }
}
"""


def compose(directory: Path) -> None:
    """Write the lifecycle configuration into ``directory``: the whole seed blocks and our files in the
    root module, and each fragment, unchanged inside a ``locals`` block, with its completion in
    ``modules/<fragment>``. (The provider block is the workspace's.)"""
    for name in (*WHOLE_BLOCKS, *OURS):
        (directory / name).write_text(fixture(name), encoding="utf-8")
    for name in FRAGMENTS:
        stem = name.removesuffix(".tf")
        module = directory / "modules" / stem
        module.mkdir(parents=True, exist_ok=True)
        (module / "versions.tf").write_text(MODULE_VERSIONS, encoding="utf-8")
        (module / name).write_text("locals {\n" + fixture(name) + "}\n", encoding="utf-8")
        (module / f"{stem}.completion.tf").write_text(fixture(f"{stem}.completion.tf"), encoding="utf-8")
