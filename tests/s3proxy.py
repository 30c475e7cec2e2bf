"""A TCP proxy in front of the moto S3 server that can stop answering, for outage tests.

``fail_after(n)``: after n more HTTP requests, every request is cut off (the connection is reset
before a response), as when S3 or its network stops answering; ``up()`` restores service.
Requests are counted from the request lines the client sends, so kept-alive connections count
each request.
"""

from __future__ import annotations

import socket
import threading


class FlakyProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.requests = 0
        self.budget: int | None = None  # requests still allowed; None: unlimited
        self.refused = 0
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_after(self, n: int) -> None:
        with self._lock:
            self.budget = n

    def up(self) -> None:
        with self._lock:
            self.budget = None

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def _allow(self, new_requests: int) -> bool:
        with self._lock:
            self.requests += new_requests
            if self.budget is None:
                return True
            self.budget -= new_requests
            if self.budget < 0:
                self.refused += new_requests
                return False
            return True

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target)
        except OSError:
            client.close()
            return

        def upstream() -> None:
            try:
                while data := client.recv(65536):
                    if not self._allow(data.count(b" HTTP/1.1\r\n")):
                        # Reset, not a clean close: what a dead endpoint looks like to the client.
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                        break
                    server.sendall(data)
            except OSError:
                pass
            finally:
                for s in (client, server):
                    try:
                        s.close()
                    except OSError:
                        pass

        def downstream() -> None:
            try:
                while data := server.recv(65536):
                    client.sendall(data)
            except OSError:
                pass

        threading.Thread(target=downstream, daemon=True).start()
        upstream()
