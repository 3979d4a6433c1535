"""The HTTP server behind both Prometheus endpoints (a rank's ``prometheus_port`` and the node agent's).

prometheus_client's own server is a ThreadingHTTPServer with no timeouts: every connection gets a thread that
waits for its request for ever, so slow or half-open connections (a port scanner, a misconfigured client, a
hostile local user) pile up until scrapes go unanswered. This one closes a connection that sends nothing for
IDLE_TIMEOUT_S, closes any connection still open REQUEST_DEADLINE_S after it was accepted (a client that
trickles its request byte by byte), and holds at most MAX_CONNECTIONS_PER_CLIENT connections of one client
address: beyond it a new connection of that client is closed at once. When MAX_CONNECTIONS are open in all
(half-open connections from many addresses), a newcomer takes the place of the oldest connection of the client
holding the most, so that a scraper from another address is still answered. No torch.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

IDLE_TIMEOUT_S = 5.0  # a connection silent this long (no request, or a stalled one) is closed
REQUEST_DEADLINE_S = 10.0  # Prometheus' default scrape timeout: no scrape needs a connection longer
MAX_CONNECTIONS_PER_CLIENT = 8  # a Prometheus server holds one per target; a few for ad-hoc curls
MAX_CONNECTIONS = 64  # in all: the threads the endpoint runs at once (and those of evicted ones, ending)
LISTEN_BACKLOG = 128
CHECK_INTERVAL_S = 0.5  # how often the deadline is checked (the serving loop's poll interval)


class _Handler(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT_S  # socket timeout of every read and write: a silent connection ends

    def log_message(self, *_args) -> None:  # scrapes are not worth a line each on the job's stderr
        pass


class BoundedServer(socketserver.ThreadingMixIn, WSGIServer):
    """A threading WSGI server that bounds its connections per client address and in all, and their time."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, *args, **kwargs):
        self._open: dict[socket.socket, tuple[str, float]] = {}  # connection -> (client address, accepted at)
        self._per_client: dict[str, int] = {}
        self._open_lock = threading.Lock()
        self.refused = 0  # connections closed at once: over a bound
        self.evicted = 0  # connections closed to make room for another client's
        self.expired = 0  # connections closed at their deadline
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        client = str(client_address[0])
        evicted = None
        with self._open_lock:
            held = self._per_client.get(client, 0)
            over = held >= MAX_CONNECTIONS_PER_CLIENT
            if not over and len(self._open) >= MAX_CONNECTIONS:
                evicted = self._oldest_of_the_busiest(held)
                over = evicted is None
            if not over:
                self._open[request] = (client, time.monotonic())
                self._per_client[client] = held + 1
        if evicted is not None:
            self.evicted += 1
            with contextlib.suppress(OSError):
                evicted.shutdown(socket.SHUT_RDWR)  # its thread's read or write ends
        if over:
            self.refused += 1
            super().shutdown_request(request)
            return
        super().process_request(request, client_address)

    def _oldest_of_the_busiest(self, held: int) -> socket.socket | None:
        """With every place taken: the oldest connection of the client holding the most (removed from the
        books), when that client holds more than the newcomer's ``held``; None when no one does."""
        busiest = max(self._per_client.values(), default=0)
        if busiest <= held:
            return None
        conn, (client, _) = min(
            ((c, entry) for c, entry in self._open.items() if self._per_client[entry[0]] == busiest),
            key=lambda item: item[1][1],
        )
        del self._open[conn]
        self._per_client[client] -= 1
        if not self._per_client[client]:
            del self._per_client[client]
        return conn

    def shutdown_request(self, request) -> None:
        with self._open_lock:
            entry = self._open.pop(request, None)
            if entry is not None:
                left = self._per_client[entry[0]] - 1
                if left:
                    self._per_client[entry[0]] = left
                else:
                    del self._per_client[entry[0]]
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        """A connection that timed out, was shut at its deadline or reset by its client is no error worth a
        traceback on the job's stderr; anything else still is."""
        import sys

        if not isinstance(sys.exc_info()[1], OSError):  # TimeoutError and ConnectionError are OSErrors
            super().handle_error(request, client_address)

    def service_actions(self) -> None:
        """Run by the serving loop between requests: connections past their deadline are shut, which ends the
        read or write their thread is blocked in."""
        now = time.monotonic()
        with self._open_lock:
            late = [conn for conn, (_, accepted) in self._open.items() if now - accepted > REQUEST_DEADLINE_S]
        for conn in late:
            self.expired += 1
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def open_connections(self) -> int:
        with self._open_lock:
            return len(self._open)


def serve_wsgi(app, port: int, addr: str) -> BoundedServer:
    """Serve ``app`` on ``addr:port`` from a daemon thread; returns the server (OSError when the port is taken)."""
    family = socket.getaddrinfo(addr or None, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("BoundedServer", (BoundedServer,), {"address_family": family})
    server = make_server(addr, port, app, server_class=server_class, handler_class=_Handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": CHECK_INTERVAL_S}, name="diag-metrics", daemon=True
    )
    thread.start()
    return server
