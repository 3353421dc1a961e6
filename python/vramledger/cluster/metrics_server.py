"""A /metrics endpoint per rank: each rank serves its own books (labelled with its rank and
devices), so Prometheus scrapes the job without any collective call (a scrape cannot make all
ranks enter one). docs/examples/prometheus_cluster_scrape.yml scrapes port base + local rank.
"""

from __future__ import annotations

import http.server
import threading
from typing import Any, Callable, Dict, Optional

from .document import local_rank_document
from .prometheus import to_prometheus


def serve_metrics(port: int, address: str = "0.0.0.0", rank: Optional[int] = None,
                  world_size: Optional[int] = None,
                  local: Optional[Callable[[int, int], Dict[str, Any]]] = None
                  ) -> http.server.ThreadingHTTPServer:
    """Starts a daemon thread serving GET /metrics; returns the server (shutdown() stops it).
    rank / world_size default to torch.distributed's when it is initialised, else 0 / 1."""
    if rank is None or world_size is None:
        try:
            import torch.distributed as dist

            initialised = dist.is_available() and dist.is_initialized()
        except ImportError:
            initialised = False
        rank = dist.get_rank() if initialised and rank is None else (rank or 0)
        world_size = dist.get_world_size() if initialised and world_size is None \
            else (world_size or 1)
    build = local or local_rank_document

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics")
                return
            body = to_prometheus(build(rank, world_size)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # scrapes are not worth a stderr line
            pass

    server = http.server.ThreadingHTTPServer((address, port), Handler)
    threading.Thread(target=server.serve_forever, name="vramledger-metrics", daemon=True).start()
    return server
