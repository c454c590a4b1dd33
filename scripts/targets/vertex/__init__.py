"""`backend: vertex`: a Pulumi stack whose jobs run as Vertex AI custom jobs."""

from scripts.targets.vertex.target import VertexTarget

__all__ = ["VertexTarget"]
