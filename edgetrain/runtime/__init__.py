from .program import Program

__all__ = ["Program"]
