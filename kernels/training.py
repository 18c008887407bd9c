"""Training kernels: gradient accumulation and the optimizer updates. They write into their input arrays: the
runtime binds those inputs to the persistent state (gradient buffers, parameters, moments), which is the point
(onnxruntime aliases the same inputs to its outputs).

Optimizer state arrives flat (every tensor of a kind concatenated, see ``edgetrain.ops.training``), so each
update is one serial loop. The loops run in the state's element type without fastmath and evaluate
onnxruntime's expressions in its order (``(lr_corrected * m) / (sqrt(v) + eps)``, ...), and the step-dependent
scalars are rounded to the state's type after each operation, as onnxruntime's float code does. Against
ORT 1.19.2 on x86-64 the moments come out bit for bit and the parameters within 1-2 ulp (its vectorized Eigen
loops differ in the last bit for a few percent of elements). Divisions go through ``np.divide``: IEEE
results (inf, NaN) as onnxruntime gives, where Numba's ``/`` would raise ZeroDivisionError (eps = 0).
"""
import math

import numpy as np

from edgetrain.errors import InputError

from edgetrain import parallel

from . import bindable, direct
from ._jit import jit

UPDATE_BLOCK = 1 << 18      # elements of an optimizer update a thread's block holds at least: ~0.2-0.4 ms of
                            # AdamW, above a hand-off (ResNet-18's 11 M parameters: 14 ms in one thread)


def accumulate(ctx):
    n_in = len(ctx.node.inputs)

    def run(*args):
        buffer, value = args[0], args[1]
        overwrite = args[2] if n_in > 2 else None
        done, updated = args[n_in], (args[n_in + 1] if len(args) > n_in + 1 else None)
        if overwrite is not None and overwrite.reshape(-1)[0]:
            np.copyto(buffer, value)
        else:
            np.add(buffer, value, out=buffer)
        done[0] = True
        if updated is not None:
            np.copyto(updated, buffer)
    return run


def _copy_outputs(args, n_in: int, sources: tuple[int, ...]):
    """Optional outputs 1.. are copies of the updated inputs ``sources``, unless they are those very arrays."""
    for k, src in enumerate(sources, start=1):
        out = args[n_in + k] if n_in + k < len(args) else None
        if out is not None and out.ctypes.data != args[src].ctypes.data:
            np.copyto(out, args[src])


def _output_copies(args, n_in: int, sources: tuple[int, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``_copy_outputs`` decided at bind time: (output, updated input) pairs that are not the same array."""
    pairs = []
    for k, src in enumerate(sources, start=1):
        out = args[n_in + k] if n_in + k < len(args) else None
        if out is not None and out.ctypes.data != args[src].ctypes.data:
            pairs.append((out, args[src]))
    return pairs


def _signal(args, i: int, n_in: int) -> bool:
    return i >= n_in or args[i] is None or bool(args[i].reshape(-1)[0])


# --- AdamW ----------------------------------------------------------------------------------------------------

def adamw(ctx):
    """com.microsoft AdamWOptimizer (attribute defaults as onnxruntime's kernel: 0.9, 0.999, 1e-8, 0, mode 0,
    correct_bias 1)."""
    n_in = len(ctx.node.inputs)
    dtype = ctx.type(2).dtype
    alpha, beta = dtype.type(ctx.attr("alpha")), dtype.type(ctx.attr("beta"))
    # alpha, beta, 1 - alpha, 1 - beta, epsilon, weight decay, in the state's type (ORT: float arithmetic)
    consts = np.array([alpha, beta, dtype.type(1) - alpha, dtype.type(1) - beta,
                       ctx.attr("epsilon"), ctx.attr("weight_decay")], dtype)
    mode, correct_bias = ctx.attr("adam_mode"), bool(ctx.attr("correct_bias"))
    scratch = np.zeros(6, dtype)     # step-dependent scalars, rounded to the state's type (made once)

    @bindable
    def bind(*args):
        signal = args[6].reshape(-1) if 6 < n_in and args[6] is not None else None
        updated, step = args[n_in], args[1]
        call = (args[2], args[3], args[4], args[5], args[0], step, consts, scratch, mode, correct_bias)
        copies = _output_copies(args, n_in, (2, 4, 5))
        update = [adamw_update]     # direct once compiled: the first update compiles or loads it
        size, threads = args[2].shape[0], parallel.slots()
        native = _native_update(call)
        if native is not None:
            def apply(*_call):
                native()
        elif threads >= 2 and size >= 2 * UPDATE_BLOCK:
            # element-wise, so blocks of the flat state give every element the one thread's bits; each thread
            # stores the step's scalars into its own scratch row
            rows = np.zeros((threads, scratch.shape[0]), scratch.dtype)
            arrays = call[:4]

            def work(slot, lo, hi):
                update[0](*(a[lo:hi] for a in arrays), *call[4:7], rows[slot], *call[8:])

            def apply(*call):
                if update[0] is adamw_update:      # compiles (or loads) once, in the calling thread
                    adamw_update(*call)
                else:
                    parallel.split(size, work, UPDATE_BLOCK)
        else:
            apply = None

        def run():
            if signal is not None and not signal[0]:
                updated[0] = False
            else:
                if correct_bias and step[0] < 1:
                    raise InputError(f"{ctx.node}: step is {int(step[0])}; it must be the 1-based number of this "
                                     "update (steps taken + 1, as onnxruntime feeds it): bias correction divides "
                                     "by 1 - beta1^step")
                (apply or update[0])(*call)
                if update[0] is adamw_update and native is None:     # the native pool never calls it alone
                    update[0] = direct(adamw_update, call)
                updated[0] = True
            for out, src in copies:
                np.copyto(out, src)
        run.kernel_calls = ((adamw_update, call),) + (native.kernel_calls if native is not None else ())
        return run, ()
    return bind


def _native_update(call):
    """The update on the native threads of ``_gemm_pool`` (no GIL between blocks), or None (one thread, too
    small, other types, or the trimmed runtime, which has no ``_gemm_pool``)."""
    try:
        from . import _gemm_pool
    except ImportError:
        return None
    found = _gemm_pool.adamw_job(call)
    return found[0] if found is not None else None


@jit
def adamw_update(p, g, m, v, lr_in, step_in, c, s, mode, correct_bias):
    """In place over flat p, g, m, v. ``c``: alpha, beta, 1-alpha, 1-beta, eps, wd. ``s`` holds the scalars,
    each stored (so rounded to p's type) right after it is computed, in onnxruntime's order:
    lr, 1 - alpha^t, 1 - beta^t, lr * sqrt(1 - beta^t) / (1 - alpha^t), lr * wd."""
    step = step_in[0]
    s[0] = lr_in[0]
    s[1] = 1.0
    s[2] = 1.0
    if correct_bias:
        s[1] = math.pow(np.float64(c[0]), np.float64(step))   # std::pow(float, int64) is a double
        s[1] = 1.0 - s[1]
        s[2] = math.pow(np.float64(c[1]), np.float64(step))
        s[2] = 1.0 - s[2]
    s[3] = math.sqrt(s[2])
    s[3] = np.divide(s[3], s[1])
    s[3] = s[0] * s[3]
    s[4] = s[0] * c[5]
    lr, alpha_corr, beta_corr, lr_corr, lr_wd = s[0], s[1], s[2], s[3], s[4]
    a, b, oma, omb, eps, wd = c[0], c[1], c[2], c[3], c[4], c[5]
    n = p.shape[0]
    if mode == 1:
        # Hugging Face: bias correction folded into the learning rate, weight decay after the update
        for i in range(n):
            gi = g[i]
            mi = a * m[i] + oma * gi
            vi = b * v[i] + omb * gi * gi
            m[i] = mi
            v[i] = vi
            w = p[i] - np.divide(lr_corr * mi, np.sqrt(vi) + eps)
            p[i] = w - lr_wd * w
    else:
        # PyTorch: weight decay first, moments corrected one by one
        for i in range(n):
            w = p[i]
            w = w - w * lr * wd
            gi = g[i]
            mi = a * m[i] + oma * gi
            vi = b * v[i] + omb * gi * gi
            m[i] = mi
            v[i] = vi
            p[i] = w - np.divide(lr * mi, alpha_corr * (np.sqrt(np.divide(vi, beta_corr)) + eps))


# --- SGD ------------------------------------------------------------------------------------------------------

def sgd(ctx):
    """com.microsoft SGDOptimizerV2: p -= lr * g."""
    n_in = len(ctx.node.inputs)
    scratch = np.zeros(1, ctx.type(1).dtype)

    def run(*args):
        if not _signal(args, 3, n_in):
            args[n_in][0] = False
        else:
            _sgd(args[1], args[2], args[0], scratch)
            args[n_in][0] = True
        _copy_outputs(args, n_in, (1,))
    return run


@jit
def _sgd(p, g, lr_in, s):
    s[0] = -lr_in[0]
    neg_lr = s[0]
    for i in range(p.shape[0]):
        p[i] = p[i] + neg_lr * g[i]


def sgd_momentum(ctx):
    """ai.edgetrain SGDOptimizer: torch.optim.SGD with momentum, Nesterov and weight decay (dampening 0)."""
    n_in = len(ctx.node.inputs)
    dtype = ctx.type(1).dtype
    consts = np.array([ctx.attr("momentum"), ctx.attr("weight_decay")], dtype)
    nesterov = bool(ctx.attr("nesterov"))
    scratch = np.zeros(1, dtype)

    def run(*args):
        _sgd_momentum(args[1], args[2], args[3], args[0], consts, scratch, nesterov)
        args[n_in][0] = True
        _copy_outputs(args, n_in, (1, 3))
    return run


@jit
def _sgd_momentum(p, g, vel, lr_in, c, s, nesterov):
    """g' = g + wd p; v = momentum v + g' (v starts at 0, so the first step gives g', as torch's clone);
    p -= lr (g' + momentum v) with Nesterov, else lr v."""
    s[0] = lr_in[0]
    lr = s[0]
    mom, wd = c[0], c[1]
    for i in range(p.shape[0]):
        w = p[i]
        gi = g[i] + wd * w
        vi = mom * vel[i] + gi
        vel[i] = vi
        if nesterov:
            w = w - lr * (gi + mom * vi)
        else:
            w = w - lr * vi
        p[i] = w


# --- global-norm clipping -------------------------------------------------------------------------------------

def clip_grad_norm(ctx):
    """com.microsoft InplaceClipGradNorm: g *= min(max_norm / (||g||_2 + 1e-6), 1), in place."""
    n_in = len(ctx.node.inputs)
    dtype = ctx.type(0).dtype
    consts = np.array([ctx.attr("max_norm"), 1e-6], dtype)
    scratch = np.zeros(2, dtype)

    def run(*args):
        _clip_grad_norm(args[0], consts, scratch)
        out = args[n_in] if n_in < len(args) else None
        if out is not None and out.ctypes.data != args[0].ctypes.data:
            np.copyto(out, args[0])
    return run


@jit(fastmath=True)
def _sum_squares(g):
    acc = np.float64(0.0)   # float64 without the JIT too
    for i in range(g.shape[0]):
        x = np.float64(g[i])
        acc += x * x
    return acc


@jit
def _clip_grad_norm(g, c, s):
    """s[0] = the L2 norm (summed in float64, rounded to g's type), s[1] = the clip coefficient."""
    s[0] = math.sqrt(_sum_squares(g))
    s[1] = s[0] + c[1]
    s[1] = np.divide(c[0], s[1])
    coef = s[1]
    if not coef >= 1.0:     # std::min(coef, 1) scales by NaN too, as onnxruntime does
        for i in range(g.shape[0]):
            g[i] = g[i] * coef
