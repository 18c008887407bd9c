"""Every error edgetrain raises on purpose is an EdgetrainError; messages name the node, op, tensor or file."""


class EdgetrainError(Exception):
    """Base class of edgetrain's errors."""


class ModelLoadError(EdgetrainError):
    """A model file is missing, malformed, truncated or points outside its folder."""


class GraphError(EdgetrainError):
    """The graph breaks an IR invariant (single assignment, defined inputs, topological order)."""


class UnsupportedOpError(EdgetrainError):
    """A node's op, domain, opset or dtype has no definition in the op table."""


class ShapeError(EdgetrainError):
    """A shape rule rejected a node's input shapes or attributes."""


class InputError(EdgetrainError):
    """A feed is missing, unexpected, or has the wrong shape or dtype."""


class MemoryBudgetError(EdgetrainError):
    """The planned arena does not fit the memory budget."""


class AttributeValueError(ShapeError):
    """A node's attribute is unknown to its op, of the wrong type, out of range, or not finite."""


class CacheFolderError(EdgetrainError):
    """The kernel cache folder cannot be created, or others could write to it (owner, mode)."""


class NominalStateError(EdgetrainError, RuntimeError):
    """A nominal checkpoint state (parameter names and types only) was asked for values before they were loaded.
    A RuntimeError too, as onnxruntime raises one at the same points."""
