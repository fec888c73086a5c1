"""``terraform-provider-platform-orchestrator``: the executable Terraform starts (plugin protocol 6).

Run by hand it says what it is and how to install it, instead of waiting for a handshake that never comes.
Terraform starts it several times per command (the schema, the validation, the work), so a start imports
only the gRPC server (`plugin`); each request imports what it needs (tests/unit/test_tfprovider_startup.py).
"""

from __future__ import annotations

import os
import sys

MAGIC_COOKIE_KEY = "TF_PLUGIN_MAGIC_COOKIE"
#: go-plugin's cookie for Terraform's providers: public, a guard against starting the plugin by hand.
MAGIC_COOKIE_VALUE = "d602bf8f470bc67ca7faa0386276bbdd4330efaf76d1a219cb4d6991ca9872b2"


def main() -> None:
    if os.environ.get(MAGIC_COOKIE_KEY) != MAGIC_COOKIE_VALUE:
        print(
            "terraform-provider-platform-orchestrator is a Terraform provider plugin: Terraform starts it.\n"
            "Install it for Terraform with `octl terraform install-provider DIR` and use the CLI "
            "configuration that command prints.",
            file=sys.stderr,
        )
        sys.exit(1)
    from orchestrator.tfprovider.plugin import run

    run()


if __name__ == "__main__":
    main()
