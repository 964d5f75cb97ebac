"""A loopback stand-in for the Hugging Face Hub: the few endpoints huggingface_hub and localrun's pull call.

    GET  /api/models/OWNER/REPO[/revision/REV]     model info; ?blobs=true adds size + lfs.sha256
    HEAD /OWNER/REPO/resolve/REV/FILE              ETag, X-Repo-Commit, X-Linked-Size, X-Linked-Etag (sha256)
    GET  /OWNER/REPO/resolve/REV/FILE              the bytes; honours ``Range: bytes=N-`` (206)

Knobs (attributes of ``FakeHub``): ``sha_override[file]`` advertises another sha256 (a checksum
mismatch), ``drop_after`` closes the connection after that many body bytes on the next GET,
``gated`` repos answer 403 ``X-Error-Code: GatedRepo`` unless the request carries ``good_token``.
``requests`` logs (method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    return h.hexdigest()


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, Path]], shas: dict[Path, str] | None = None) -> None:
        self.repos = repos
        self.shas = dict(shas or {})
        self.sha_override: dict[str, str] = {}
        self.drop_after: int | None = None
        self.gated: set[str] = set()
        self.good_token = "hf_good"
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def sha(self, path: Path) -> str:
        if path not in self.shas:
            self.shas[path] = sha256_file(path)
        return self.shas[path]

    # -- request handling -------------------------------------------------------------------------
    def _send(self, h, code: int, headers: dict, body: bytes = b"", head: bool = False) -> None:
        h.send_response(code)
        for k, v in headers.items():
            h.send_header(k, str(v))
        if "Content-Length" not in headers:
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if body and not head:
            h.wfile.write(body)

    def _error(self, h, code: int, error_code: str, head: bool) -> None:
        self._send(h, code, {"X-Error-Code": error_code, "X-Error-Message": error_code,
                             "Content-Type": "application/json"}, json.dumps({"error": error_code}).encode(), head)

    def _handle(self, h, head: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append((h.command, path, h.headers.get("Range")))
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "models"]:
            return self._model_info(h, parts[2:], head)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, file = f"{parts[0]}/{parts[1]}", "/".join(parts[4:])
            if repo not in self.repos:
                return self._error(h, 401, "RepoNotFound", head)
            if repo in self.gated and h.headers.get("Authorization") != f"Bearer {self.good_token}":
                return self._error(h, 403, "GatedRepo", head)
            if file not in self.repos[repo]:
                return self._error(h, 404, "EntryNotFound", head)
            return self._file(h, self.repos[repo][file], file, head)
        self._error(h, 404, "NotFound", head)

    def _model_info(self, h, parts: list[str], head: bool) -> None:
        repo = "/".join(parts[:2])
        if repo not in self.repos:
            return self._error(h, 401, "RepoNotFound", head)
        if repo in self.gated and h.headers.get("Authorization") != f"Bearer {self.good_token}":
            return self._error(h, 403, "GatedRepo", head)
        siblings = []
        for name, p in self.repos[repo].items():
            size = p.stat().st_size
            sha = self.sha_override.get(name) or self.sha(p)
            siblings.append({"rfilename": name, "size": size, "blobId": sha[:40],
                             "lfs": {"size": size, "sha256": sha, "pointerSize": 134}})
        body = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                           "gated": repo in self.gated, "siblings": siblings}).encode()
        self._send(h, 200, {"Content-Type": "application/json"}, body, head)

    def _file(self, h, p: Path, name: str, head: bool) -> None:
        size = p.stat().st_size
        sha = self.sha_override.get(name) or self.sha(p)
        common = {"ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": size,
                  "X-Repo-Commit": COMMIT, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and not head:
            start = int(rng[6:].split("-")[0])
            if start >= size:
                return self._send(h, 416, {"Content-Range": f"bytes */{size}"})
            self._send(h, 206, {**common, "Content-Length": size - start,
                                "Content-Range": f"bytes {start}-{size - 1}/{size}"}, head=True)
        else:
            self._send(h, 200, {**common, "Content-Length": size}, head=True)
        if head:
            return
        drop, self.drop_after = self.drop_after, None
        sent = 0
        with open(p, "rb") as f:
            f.seek(start)
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                if drop is not None and sent + len(b) > drop:
                    h.wfile.write(b[: drop - sent])
                    h.wfile.flush()
                    h.connection.shutdown(socket.SHUT_RDWR)
                    h.close_connection = True
                    return
                try:
                    h.wfile.write(b)
                except (BrokenPipeError, ConnectionResetError):
                    return
                sent += len(b)
