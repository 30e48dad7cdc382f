"""The admin commands, one module each (plan, devices, explain, doctor, shims for install-shims, forget): each
takes plain values and returns what to print and an exit status. Each module's `main(settings, words) -> int`
is its runner: cmdline.own_options.COMMANDS names the module of each command word, entry.py reads the
command's options from the same table and imports the module only when its word runs.

Owns what each command prints. A command may use everything below it; it must not import another command,
and nothing imports a command."""
