"""Models: architecture registry, forwards over chunks, expert providers."""
from strata.models.provider import ExpertProvider, ResidentProvider
from strata.models.registry import ARCHS, get_arch

__all__ = ["ARCHS", "ExpertProvider", "ResidentProvider", "get_arch"]
