"""pytest plugin (-p peers_sigint): Ctrl-C semantics for a run that run.sh started in the background.

A non-interactive shell starts background commands with SIGINT ignored, and
Python then leaves it ignored, so `timeout -s INT` could not interrupt the
run and pytest would be killed without writing its --junitxml. Restoring
Python's default handler makes the time-out an interruption: pytest stops,
reports what ran and writes the XML. Loaded in pytest-xdist's workers too.
"""
import signal

signal.signal(signal.SIGINT, signal.default_int_handler)
