"""Render every command's ``--help`` into one Markdown page (docs/cli.md).

``python -m stoker.cli.docs > docs/cli.md`` regenerates the page; a test checks that the
committed page matches, so the docs cannot drift from the options.
"""

from __future__ import annotations

import click
from click.testing import CliRunner

from stoker.cli.main import cli

WIDTH = 100


def render() -> str:
    """The Markdown page: an intro, then one section per command with its help text."""
    runner = CliRunner()
    parts = [
        "# stoker command line",
        "",
        "Generated from `--help` by `python -m stoker.cli.docs`; do not edit by hand.",
        "",
        "## stoker",
        "",
        "```text",
        runner.invoke(cli, ["--help"], terminal_width=WIDTH, prog_name="stoker").output.rstrip(),
        "```",
    ]
    if not isinstance(cli, click.Group):
        raise TypeError("stoker's CLI entry point must be a click group")
    for name in sorted(cli.commands):
        command = cli.commands[name]
        paths = [[name]]
        if isinstance(command, click.Group):
            paths += [[name, sub] for sub in sorted(command.commands)]
        for path in paths:
            help_text = runner.invoke(
                cli, [*path, "--help"], terminal_width=WIDTH, prog_name="stoker"
            ).output
            title = " ".join(path)
            parts += ["", f"## stoker {title}", "", "```text", help_text.rstrip(), "```"]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(render(), end="")
