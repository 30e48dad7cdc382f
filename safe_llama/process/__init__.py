"""The OS side of one llama.cpp child: its fork and exec with the child's set-up (fork_exec), the pty or pipes
to it (channels) and the bytes moved through them (relay), signals (signals), the loop that supervises it from
spawn to reap and how the run ended (supervise), when its start-up is over (readiness), systemd's notify socket
(sdnotify), and the TCP checks of the RPC workers a launch names (workers).

Owns the processes, descriptors, signals and sockets of a launch. Must not decide what to start or whether to
try again (attempts/ does), nor remember anything between launches (remembered/)."""
