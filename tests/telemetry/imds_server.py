"""A loopback HTTP server that speaks the EC2 instance metadata protocol (IMDSv2) for spot notices.

`PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds` issues a session token;
`GET /latest/meta-data/spot/instance-action` with `X-aws-ec2-metadata-token` answers 404 (no
notice) or 200 with the notice JSON; without a valid token, 401, as IMDSv2 does.

    with ImdsServer() as imds:       # imds.endpoint = "http://127.0.0.1:PORT"
        imds.notice = {"action": "terminate", "time": "2026-01-01T00:02:00Z"}
"""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_PATH = "/latest/api/token"
NOTICE_PATH = "/latest/meta-data/spot/instance-action"


class ImdsServer:
    def __init__(self) -> None:
        self.notice: dict | None = None
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self, status: int, body: bytes = b"", kind: str = "text/plain") -> None:
                server.requests.append((self.command, self.path, status))
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:
                if self.path != TOKEN_PATH:
                    return self._answer(404)
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                if not ttl or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return self._answer(400)
                token = secrets.token_urlsafe(16)
                server.tokens.add(token)
                self._answer(200, token.encode())

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") not in server.tokens:
                    return self._answer(401)
                if self.path != NOTICE_PATH or server.notice is None:
                    return self._answer(404)
                self._answer(200, json.dumps(server.notice).encode(), "application/json")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> ImdsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def polls(self) -> int:
        """Notice requests that carried a valid token."""
        return sum(1 for method, path, status in self.requests if method == "GET" and status != 401)
