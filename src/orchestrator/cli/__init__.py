"""Composition roots for the command-line programs: `orchestrator`, `octl`, `po-runner`."""
