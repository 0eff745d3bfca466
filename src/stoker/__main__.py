"""``python -m stoker`` runs the command line."""

from stoker.cli.main import main

main()
