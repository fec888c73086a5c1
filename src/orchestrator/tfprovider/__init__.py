"""The ``platform-orchestrator`` Terraform provider (plugin protocol 6); see README.md.

Nothing is imported here, so that ``octl`` can name the package (``install``) without the provider's
dependencies.
"""
