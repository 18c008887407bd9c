"""edgetrain: train ONNX models on small Linux boards with Numba kernels over one planned arena."""
import os as _os

__version__ = "0.1.0"

# One BLAS thread unless the user says otherwise: on contended cores threads only stall (NUMBA_NOTES §4, §6).
# These only take effect if numpy is not imported yet; blas.limit_blas_threads handles the other case.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, _os.environ.get("EDGETRAIN_NUM_THREADS", "1"))

from .errors import EdgetrainError  # noqa: E402
from .ortvalue import OrtValue  # noqa: E402
from .session import InferenceSession  # noqa: E402

__all__ = ["EdgetrainError", "ForwardBackward", "InferenceSession", "OrtValue", "__version__"]


def __getattr__(name):
    # imported on first use: the autodiff and planning it pulls in would make every `import edgetrain` heavier
    if name == "ForwardBackward":
        from .forward_backward import ForwardBackward
        return ForwardBackward
    raise AttributeError(f"module 'edgetrain' has no attribute '{name}'")
