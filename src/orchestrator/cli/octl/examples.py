"""The ``Example:`` section of every ``octl`` command's ``--help`` (tests/integration/test_octl_help.py
checks that none lacks one). A command whose docstring has its own ``Example:`` keeps it; the others get
theirs from :data:`EXAMPLES`, attached once the commands are registered."""

from __future__ import annotations

import click

U = "5f0c6a52-3a4e-4d8f-9d0e-2b7c1e4f8a90"

#: Command path -> example command lines (shown as written).
EXAMPLES: dict[tuple[str, ...], tuple[str, ...]] = {
    (): (
        "octl config set-url http://127.0.0.1:8080",
        "octl get runners",
        "octl deploy shop dev manifest.yaml",
    ),
    ("create",): ("octl create project shop", "octl create runner my-runner --set-yaml=@runner.yaml"),
    ("get",): ("octl get deployments --status failed", "octl get runner my-runner -o yaml"),
    ("update",): ("octl update project shop --set display_name='Web shop'",),
    ("delete",): ("octl delete runner-rule " + U, "octl delete env shop dev --yes"),
    ("config", "set-url"): ("octl config set-url https://po.example.com",),
    ("config", "set-org"): ("octl config set-org acme",),
    ("config", "set-token"): (
        "octl config set-token            # asks, hidden",
        'echo "$TOKEN" | octl config set-token',
    ),
    ("config", "show"): ("octl config show", "octl --profile prod config show"),
    ("config", "use"): ("octl config use prod", "octl config use default"),
    ("create", "agent-key"): (
        "octl create agent-key --runner-type kubernetes-agent --private-key-file agent.pem > runner.yaml",
    ),
    ("create", "env"): ("octl create env shop dev --set env_type_id=development",),
    ("create", "env-type"): ("octl create env-type development --set display_name=Development",),
    ("create", "module"): ("octl create module postgres-rds --set-yaml=@module.yaml",),
    ("create", "module-rule"): (
        "octl create module-rule --set module_id=postgres-rds --set env_type_id=production",
    ),
    ("create", "org"): ("octl create org acme            # a platform admin token",),
    ("create", "project"): ("octl create project shop --set display_name='Web shop'",),
    ("create", "provider"): ("octl create provider aws main --set-yaml=@provider.yaml",),
    ("create", "resource-type"): ("octl create resource-type postgres --set-yaml=@resource-type.yaml",),
    ("create", "runner"): (
        "octl create runner my-runner --set-yaml=@examples/runners/kubernetes-agent.yaml",
    ),
    ("create", "runner-rule"): (
        "octl create runner-rule --set runner_id=my-runner",
        "octl create runner-rule --set runner_id=prod-runner --set env_type_id=production",
    ),
    ("create", "token"): ("octl create token --set role=deployer --set description=ci -o json",),
    ("delete", "env-type"): ("octl delete env-type staging",),
    ("delete", "module"): ("octl delete module postgres-rds",),
    ("delete", "module-rule"): ("octl delete module-rule " + U,),
    ("delete", "project"): ("octl delete project shop",),
    ("delete", "provider"): ("octl delete provider aws main",),
    ("delete", "resource-type"): ("octl delete resource-type postgres",),
    ("delete", "runner"): ("octl delete runner my-runner",),
    ("delete", "runner-rule"): ("octl delete runner-rule " + U,),
    ("delete", "token"): ("octl delete token " + U,),
    ("deploy",): (
        "octl deploy shop dev manifest.yaml",
        "octl deploy shop dev manifest.yaml --plan-only",
        "octl deploy shop dev - --no-wait < manifest.yaml",
    ),
    ("get", "available-resource-types"): ("octl get available-resource-types shop dev",),
    ("get", "compatibility-matrix"): ("octl get compatibility-matrix",),
    ("get", "deployment"): ("octl get deployment " + U, "octl get dep " + U + " -o yaml"),
    ("get", "deployments"): (
        "octl get deployments --project shop --env dev",
        "octl get deps --status failed -o wide",
    ),
    ("get", "env"): ("octl get env shop dev",),
    ("get", "env-type"): ("octl get env-type development",),
    ("get", "env-types"): ("octl get env-types",),
    ("get", "envs"): ("octl get envs shop", "octl get envs --env-type production -o json"),
    ("get", "module"): ("octl get module postgres-rds -o yaml",),
    ("get", "module-rule"): ("octl get module-rule " + U,),
    ("get", "module-rules"): ("octl get module-rules",),
    ("get", "module-version"): ("octl get module-version postgres-rds " + U,),
    ("get", "module-versions"): ("octl get module-versions postgres-rds",),
    ("get", "modules"): ("octl get modules",),
    ("get", "org"): ("octl get org acme",),
    ("get", "orgs"): ("octl get orgs            # a platform admin token",),
    ("get", "project"): ("octl get project shop",),
    ("get", "projects"): ("octl get projects -o json",),
    ("get", "provider"): ("octl get provider aws main",),
    ("get", "providers"): ("octl get providers",),
    ("get", "resource-type"): ("octl get resource-type postgres -o yaml",),
    ("get", "resource-types"): ("octl get resource-types",),
    ("get", "runner"): ("octl get runner my-runner -o yaml",),
    ("get", "runner-rule"): ("octl get runner-rule " + U,),
    ("get", "runner-rules"): ("octl get runner-rules",),
    ("get", "runners"): ("octl get runners", "octl get runners -o json | jq -r '.[].id'"),
    ("get", "token"): ("octl get token " + U,),
    ("get", "tokens"): ("octl get tokens",),
    ("get", "usage"): ("octl get usage", "octl get usage --from 2026-01-01 --to 2026-02-01 -o csv"),
    ("logs",): (
        "octl logs " + U + "                 # with the key `octl deploy` saved",
        "octl logs " + U + " --raw | jq -c 'select(.type == \"diagnostic\")'",
        "octl logs " + U + " --key @keys/" + U + ".logs.key",
    ),
    ("refresh-runner",): ("octl refresh-runner shop dev --dry-run", "octl refresh-runner shop dev"),
    ("rollback",): ("octl rollback shop dev " + U,),
    ("tf",): ("octl tf " + U + " > main.tf",),
    ("update", "env"): ("octl update env shop dev --set display_name='Development'",),
    ("update", "env-type"): ("octl update env-type development --set display_name=Dev",),
    ("update", "module"): ("octl update module postgres-rds --set-yaml=@module.yaml",),
    ("update", "project"): ("octl update project shop --set display_name='Web shop'",),
    ("update", "provider"): ("octl update provider aws main --set-yaml=@provider.yaml",),
    ("update", "resource-type"): ("octl update resource-type postgres --set description='A database'",),
    ("update", "runner"): ("octl update runner my-runner --set description='The GKE runner'",),
}


def has_example(command: click.Command) -> bool:
    return "Example" in (command.help or "") or "Example" in (command.epilog or "")


def attach(group: click.Group, path: tuple[str, ...] = ()) -> None:
    """Give each command under ``group`` (and the group) its examples, unless its docstring has some."""
    lines = EXAMPLES.get(path)
    if lines and not has_example(group):
        _add(group, lines)
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            attach(command, (*path, name))
            continue
        examples = EXAMPLES.get((*path, name))
        if examples and not has_example(command):
            _add(command, examples)


def _add(command: click.Command, lines: tuple[str, ...]) -> None:
    # \b keeps click from rewrapping the lines.
    block = "\b\nExample:\n" + "\n".join(f"  {line}" for line in lines)
    command.epilog = f"{block}\n\n{command.epilog}" if command.epilog else block
