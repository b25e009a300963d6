"""`python -m tableq.cli` runs the tableq command."""

from tableq.cli import main

main()
