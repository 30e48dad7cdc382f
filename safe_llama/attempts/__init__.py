"""The attempts of a launch: what to start next and what a failure teaches, with no process in it
(attempt_loop, retry: pure), one attempt under supervision (attempt), the hand-off to the small supervisor and
its end (handoff; at the spawn: at_spawn, and the way back from a start that failed then: resume), the shell that
drives them from a command line to the child's exit code (launch), safe-llama's own lines (say) and every way out
as its exit code (exits).

Owns the life of one launch. Must not know about typer or the admin commands; the process mechanics are
process/'s and what is remembered between launches is remembered/'s."""
