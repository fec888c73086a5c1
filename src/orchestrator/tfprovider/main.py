"""``terraform-provider-platform-orchestrator``: the executable Terraform starts (plugin protocol 6).

Run by hand it says what it is and how to install it, instead of waiting for a handshake that never comes.
"""

from __future__ import annotations

import os
import sys

MAGIC_COOKIE_KEY = "TF_PLUGIN_MAGIC_COOKIE"


def main() -> None:
    if not os.environ.get(MAGIC_COOKIE_KEY):
        print(
            "terraform-provider-platform-orchestrator is a Terraform provider plugin: Terraform starts it.\n"
            "Install it for Terraform with `octl terraform install-provider DIR` and use the CLI "
            "configuration that command prints.",
            file=sys.stderr,
        )
        sys.exit(1)
    os.environ.setdefault("PYVIDER_LOG_LEVEL", os.environ.get("PO_PROVIDER_LOG_LEVEL", "WARNING"))
    from pyvider.cli.__main__ import main as pyvider_main

    # pyvider checks that it runs as a `terraform-provider-*` executable.
    sys.argv = ["terraform-provider-platform-orchestrator", "provide"]
    pyvider_main()


if __name__ == "__main__":
    main()
