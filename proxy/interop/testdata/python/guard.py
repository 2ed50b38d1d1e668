"""What every Python process of the interop tests shares (the counterpart of
guard.mjs): it ends by itself after INTEROP_LIFETIME_MS (default 180000), so
none outlives the test run, and its protocol lines reach stdout whole.

A server also exits when its stdin closes (watch_stdin); a client reads its
commands from stdin and exits at its end.
"""

import os
import sys
import threading

_out_lock = threading.Lock()
_out = sys.stdout


def say(line: str) -> None:
    """Writes one protocol line to stdout at once, never interleaved."""
    with _out_lock:
        _out.write(line + "\n")
        _out.flush()


def take_stdout() -> None:
    """Keeps the real stdout for say() and sends everything else that would
    print there (a library's print, input() prompts) to stderr."""
    global _out
    _out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def start_lifetime() -> None:
    """Ends the process after INTEROP_LIFETIME_MS, whatever it is doing."""
    ms = int(os.environ.get("INTEROP_LIFETIME_MS") or 180000)

    def end() -> None:
        sys.stderr.write(f"guard: lifetime of {ms} ms over, exiting\n")
        sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(ms / 1000, end)
    timer.daemon = True
    timer.start()


def watch_stdin(on_line=None) -> None:
    """Exits the process when stdin closes; on_line gets each line before that."""

    def watch():
        try:
            for line in sys.stdin:
                if on_line is not None and line.strip():
                    on_line(line.strip())
        finally:
            os._exit(0)

    threading.Thread(target=watch, name="stdin-guard", daemon=True).start()
