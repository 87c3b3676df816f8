"""llama.cpp's llama-server as a measured subprocess: started on its own port of 127.0.0.1,
waited on until /health says ok, asked over HTTP (JSON in, JSON and wall seconds out), and
stopped however the run ends (terminate, wait, kill).

    with LlamaServer(cmd_without_port, log_path) as srv:   # raises StrataError, one line
        body, seconds = srv.post("/completion", {"prompt": [1, 2, 3], "n_predict": 1})
"""
from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from strata.errors import StrataError


def free_port() -> int:
    """A port of 127.0.0.1 nobody listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gguf_vocab(path: str | Path) -> int:
    """Tokens in a GGUF's vocabulary (tokenizer.ggml.tokens): the ids llama.cpp accepts."""
    import gguf
    f = gguf.GGUFReader(str(path)).get_field("tokenizer.ggml.tokens")
    if f is None:
        raise StrataError(f"{path}: the GGUF has no tokenizer.ggml.tokens; llama-server cannot "
                          f"load it")
    return len(f.data)


class LlamaServer:
    """One llama-server process; `cmd` without --host/--port (they are added), its log in
    `log_path`. `start_timeout` bounds the wait for /health (model load included)."""

    def __init__(self, cmd: list[str], log_path: str | Path, *, start_timeout: float = 600,
                 timeout: float = 1800):
        self.port = free_port()
        self.cmd = [*cmd, "--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path = Path(log_path)
        self.start_timeout, self.timeout = start_timeout, timeout
        self.proc: subprocess.Popen | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _last_line(self) -> str:
        lines = [x for x in self.log().splitlines() if x.strip()]
        return lines[-1].strip()[:200] if lines else "(no output)"

    def __enter__(self) -> "LlamaServer":
        return self if self.proc is not None else self.start()

    def start(self) -> "LlamaServer":
        """Launch and wait for /health ok; a StrataError (the log's last line) otherwise."""
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.start_timeout:
            if self.proc.poll() is not None:
                self.stop()
                raise StrataError(f"llama-server exited ({self.proc.returncode}) before it was "
                                  f"ready: {self._last_line()}")
            try:
                with urllib.request.urlopen(self._url("/health"), timeout=5) as r:
                    if json.loads(r.read()).get("status") == "ok":
                        return self
            except (urllib.error.URLError, OSError, ValueError):
                pass        # not listening yet, or 503 while the model loads
            time.sleep(0.5)
        self.stop()
        raise StrataError(f"llama-server not ready within {self.start_timeout:.0f} s (log "
                          f"{self.log_path}): {self._last_line()}")

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, wait: float = 30) -> None:
        """Terminate, wait up to `wait` s, then kill: the server never outlives the run."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def post(self, path: str, body: dict) -> tuple[dict, float]:
        """POST `body` as JSON; the answer's JSON and the wall seconds from send to answer."""
        req = urllib.request.Request(self._url(path), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                data = r.read()
        except urllib.error.HTTPError as e:
            raise StrataError(f"llama-server {path}: HTTP {e.code}: "
                              f"{e.read().decode(errors='replace')[:200]}") from None
        return json.loads(data), time.perf_counter() - t0
