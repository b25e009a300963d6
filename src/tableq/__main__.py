"""`python -m tableq ...`: the `tableq` command line."""

from tableq.cli import main

main()
