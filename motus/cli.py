"""The ``motus`` command: ``motus serve start ...`` and the client commands under ``motus serve``."""

from __future__ import annotations

import click

from motus import __version__
from motus.serve.cli import serve


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="motus")
def main() -> None:
    """motus: serve AI agents over HTTP, and let them pause to ask a person."""


main.add_command(serve)
