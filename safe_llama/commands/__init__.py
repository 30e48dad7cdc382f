"""The admin commands, one module each (plan, devices, explain, doctor, shims for install-shims, forget): each
takes plain values and returns what to print and an exit status. Each module's `main(settings, words) -> int`
is its runner: cmdline.own_options.COMMANDS names the module of each command word, entry.py reads the
command's options from the same table and imports the module only when its word runs. rpc_server
(`safe-llama rpc-server`) is the one command outside that table: its arguments are ggml-rpc-server's own,
handed on untouched (no option of safe-llama's to read), so entry.py calls its run_rpc_server directly.

Owns what each command prints. A command may use everything below it; it must not import another command,
and nothing imports a command."""
