"""``python -m moebake`` runs the CLI."""

from moebake.cli import run

run()
