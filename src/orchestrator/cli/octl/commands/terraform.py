"""``octl terraform install-provider DIR``: the Terraform provider, installed without a registry."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.octl import output
from orchestrator.cli.octl.session import OctlGroup, UsageFailure
from orchestrator.tfprovider import install as installer


@click.group("terraform", cls=OctlGroup)
def terraform() -> None:
    """Use Terraform or OpenTofu with the orchestrator (the platform-orchestrator provider).

    \b
    Example:
      octl terraform install-provider ./po-mirror --cli-config ./po.tfrc
    """


@terraform.command("install-provider")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--cli-config",
    "cli_config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the CLI configuration to this file (use it as TF_CLI_CONFIG_FILE).",
)
def install_provider(directory: Path, cli_config: Path | None) -> None:
    """Write a filesystem mirror with the provider into DIRECTORY and print the CLI configuration.

    \b
    Example:
      octl terraform install-provider ~/.terraform.d/po-mirror --cli-config ~/.terraform.d/po.tfrc
      export TF_CLI_CONFIG_FILE=~/.terraform.d/po.tfrc
      terraform init   # source = "stellwerk-labs/platform-orchestrator" now resolves to this provider
    """
    try:
        installed = installer.install(directory)
        text = installed.cli_configuration()
        if cli_config is not None:
            cli_config.parent.mkdir(parents=True, exist_ok=True)
            cli_config.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageFailure(f"cannot write the provider mirror: {exc}") from exc
    output.success(f"Installed {installer.SOURCE} {installed.version} in {installed.mirror}.")
    if cli_config is not None:
        click.echo(
            f"CLI configuration written to {cli_config}: export TF_CLI_CONFIG_FILE={cli_config}", err=True
        )
    else:
        click.echo(
            "Add this to your Terraform CLI configuration (~/.terraformrc or TF_CLI_CONFIG_FILE):", err=True
        )
    click.echo(text, nl=False)
