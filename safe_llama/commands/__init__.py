"""The admin commands, one module each (plan, explain, doctor, install-shims): each takes plain values and
returns what to print and an exit status; cli.py maps typer onto them.

A command may use everything below it; nothing imports a command."""
