"""The cluster view (docs/report_schema.md, "Cluster report"): every rank's books in one
document over torch.distributed, as JSON, HTML or Prometheus text, and a /metrics endpoint per
rank. vramledger.cluster_report is gather.cluster_report."""

from .document import assemble, device_entry, local_rank_document, rank_document
from .gather import cluster_report
from .html import to_html
from .metrics_server import serve_metrics
from .prometheus import to_prometheus

__all__ = ["assemble", "cluster_report", "device_entry", "local_rank_document",
           "rank_document", "serve_metrics", "to_html", "to_prometheus"]
