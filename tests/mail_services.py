"""Real delivery endpoints on 127.0.0.1 for notification tests: an aiosmtpd SMTP server that keeps
what it receives, and an HTTP server that keeps the JSON bodies POSTed to it (a Slack-compatible
incoming webhook)."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from dataclasses import dataclass, field
from email import message_from_string

from tests.airflow_services import free_port


@dataclass
class Mail:
    to: list[str]
    subject: str
    body: str


@dataclass
class Inbox:
    messages: list[Mail] = field(default_factory=list)

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
        parsed = message_from_string(envelope.content.decode("utf-8", "replace"))
        parts = [part for part in parsed.walk() if not part.is_multipart()]
        body = "\n".join(part.get_payload(decode=True).decode("utf-8", "replace") for part in parts)
        self.messages.append(Mail(list(envelope.rcpt_tos), str(parsed["Subject"]), body))
        return "250 OK"


@contextlib.contextmanager
def smtp_server():
    """(inbox, port): an aiosmtpd server on 127.0.0.1 until the block ends."""
    from aiosmtpd.controller import Controller

    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


@contextlib.contextmanager
def webhook_server(status: int = 200):
    """(received, url): an HTTP server on 127.0.0.1 keeping each POSTed JSON body in `received`;
    it answers `status`."""
    received: list = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            received.append({"path": self.path,
                             "json": json.loads(self.rfile.read(int(self.headers["Content-Length"])))})
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    port = free_port()
    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received, f"http://127.0.0.1:{port}/services/T000/B000/s3cr3tT0ken"
    finally:
        server.shutdown()
        server.server_close()


def smtp_connection(port: int) -> str:
    """The AIRFLOW_CONN_<ID> value of an Airflow SMTP connection to 127.0.0.1:`port` (no TLS)."""
    return json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "port": port,
                       "extra": {"disable_tls": True, "disable_ssl": True}})
