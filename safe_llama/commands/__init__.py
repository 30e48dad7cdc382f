"""The admin commands, one module each (plan, devices, explain, doctor, install-shims): each takes plain values
and returns what to print and an exit status; entry.py reads their options (cmdline.own_options) and calls them.

Owns what each command prints. A command may use everything below it; it must not import another command,
and nothing imports a command."""
