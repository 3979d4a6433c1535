"""How ``diag dashboard`` serves its app: through waitress, a production WSGI server (Flask's own is a
development server that says so in red, colours its log even into a file and logs every request with its query
string, the ``?token=`` secret included).

By default the terminal gets only errors; ``--verbose`` adds one line per request: method, path, status and time,
never the query string, so the token appears on no line but the start-up one."""

from __future__ import annotations

import logging
import sys
import time

SERVER_THREADS = 8  # page callbacks of several open tabs at once; each is short (the poller does the reading)


class RequestLog:
    """WSGI middleware: one line per request on ``stream``, without the query string."""

    def __init__(self, app, stream=None):
        self.app, self.stream = app, stream

    def __call__(self, environ, start_response):
        started = time.perf_counter()
        status = ["-"]

        def start(status_line, headers, exc_info=None):
            status[0] = status_line.split(" ", 1)[0]
            return start_response(status_line, headers, exc_info)

        try:
            return self.app(environ, start)
        finally:
            path = _printable(environ.get("PATH_INFO", ""))
            took_ms = (time.perf_counter() - started) * 1e3
            stream = self.stream if self.stream is not None else sys.stderr
            stream.write(f"{_printable(environ.get('REQUEST_METHOD', '-'))} {path} {status[0]} {took_ms:.0f} ms\n")
            stream.flush()


def _printable(text: str) -> str:
    """A client's path as one safe line: no control characters (a crafted URL could carry terminal escapes)."""
    return "".join(c if c.isprintable() else "?" for c in text[:300])


def create_server(app, host: str, port: int, verbose: bool = False):
    """A waitress server of the Dash ``app`` bound to ``host``:``port`` (OSError when it cannot bind); run it
    with ``.run()``, stop it with ``.close()``."""
    from waitress import create_server as waitress_server

    level = logging.INFO if verbose else logging.ERROR
    for name in ("waitress", "waitress.queue"):  # "Serving on", task queue depth: said by diag, or with --verbose
        logging.getLogger(name).setLevel(level)
    wsgi = RequestLog(app.server) if verbose else app.server
    return waitress_server(wsgi, host=host, port=port, threads=SERVER_THREADS, ident="diag dashboard")
