"""`python -m agent.cli`: the `pivot` command."""

from agent.cli import main

main()
