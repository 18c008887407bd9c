"""LSTM, GRU and RNN (every direction, both layouts, initial states, sequence lengths) and their gradients.

Training speaks onnxruntime's vocabulary where it has one: an LSTM trains as com.microsoft LSTMTraining,
which also outputs every cell state (CAll) and the gate activations (IOFC), and its gradient is com.microsoft
LSTMGrad; a GRU trains as GRUTraining (outputs HAll, Ht and the gate activations ZRH) with GRUGrad.
onnxruntime has no RNN gradient: edgetrain's is ai.edgetrain RNNGrad, reading the forward Y. The saved tensors
are edgetrain's (onnxruntime's kernels take the forward direction only): HAll is Y in the node's layout, CAll
and IOFC/ZRH are [seq_length, num_directions, batch_size, k * hidden_size] in either layout, gates after their
activation (GRU's third gate is the candidate state ht~).

Gate activations: Sigmoid, Tanh and Relu (the defaults are Sigmoid and Tanh); their derivatives are read from
their outputs. ``clip``, LSTM's ``input_forget`` and other activations are refused with a clear error.
"""
from __future__ import annotations


import numpy as np

from ..ir import TensorType
from ..record import Frozen
from .attrs import Flag, Float, Floats, Int, String, Strings
from .base import NodeContext, OpDef

MS = "com.microsoft"
EDGETRAIN = "ai.edgetrain"
DIRECTIONS = ("forward", "reverse", "bidirectional")
ACTIVATIONS = {"sigmoid": 0, "tanh": 1, "relu": 2}   # codes the kernels switch on

RNN_ATTRS = {"activation_alpha": Floats(), "activation_beta": Floats(), "activations": Strings(),
             "clip": Float(), "direction": String("forward", DIRECTIONS),
             "hidden_size": Int(low=1, high=1 << 24),
             "layout": Int(0, choices=(0, 1))}


class Cell(Frozen):
    """What differs between the three cells: gates per hidden unit, default activations, the forward op's
    optional state inputs and outputs."""
    name: str
    gates: int
    activations: tuple[str, ...]
    states: int           # initial-state inputs (H0; LSTM: H0, C0)

    def __init__(self, name, gates, activations, states):
        self._set(name=name, gates=gates, activations=activations, states=states)


CELLS = {"LSTM": Cell("LSTM", 4, ("Sigmoid", "Tanh", "Tanh"), 2),
         "GRU": Cell("GRU", 3, ("Sigmoid", "Tanh"), 1),
         "RNN": Cell("RNN", 1, ("Tanh",), 1)}
CELL_OF = {"LSTM": "LSTM", "LSTMTraining": "LSTM", "LSTMGrad": "LSTM", "GRU": "GRU", "GRUTraining": "GRU",
           "GRUGrad": "GRU", "RNN": "RNN", "RNNGrad": "RNN"}


class Geometry(Frozen):
    """Sizes of a recurrent node: T steps, B sequences, I inputs, H hidden units, D directions, G gates."""
    cell: Cell
    seq: int
    batch: int
    inputs: int
    hidden: int
    directions: int
    layout: int
    acts: tuple[tuple[int, ...], ...]     # activation codes per direction
    reverse: tuple[bool, ...]             # per direction: runs from the last step to the first
    linear_before_reset: bool

    def __init__(self, cell, seq, batch, inputs, hidden, directions, layout, acts, reverse,
                 linear_before_reset=False):
        self._set(cell=cell, seq=seq, batch=batch, inputs=inputs, hidden=hidden, directions=directions,
                  layout=layout, acts=acts, reverse=reverse, linear_before_reset=linear_before_reset)

    @property
    def gates(self) -> int:
        return self.cell.gates

    def seq_major(self, t: int, b: int) -> tuple[int, int]:
        """(T, B) in the order of X's leading dims."""
        return (t, b) if self.layout == 0 else (b, t)

    def y_shape(self) -> tuple[int, ...]:
        t, b, d, h = self.seq, self.batch, self.directions, self.hidden
        return (t, d, b, h) if self.layout == 0 else (b, t, d, h)

    def state_shape(self) -> tuple[int, ...]:
        d, b, h = self.directions, self.batch, self.hidden
        return (d, b, h) if self.layout == 0 else (b, d, h)

    def saved_shape(self, per_unit: int) -> tuple[int, ...]:
        return (self.seq, self.directions, self.batch, per_unit * self.hidden)


def _activations(ctx: NodeContext, cell: Cell, directions: int) -> tuple[tuple[int, ...], ...]:
    names = ctx.attr("activations")
    n = len(cell.activations)
    if names is None:
        names = cell.activations * directions
    if names == ctx.op.attrs["activations"].default:   # RNN's schema default names two, for either direction
        names = names[:n * directions]
    if len(names) != n * directions:
        raise ctx.error(f"activations {list(names)} must name {n} function(s) per direction "
                        f"({n * directions} for direction '{ctx.attr('direction')}')")
    codes = []
    for name in names:
        code = ACTIVATIONS.get(name.lower())
        if code is None:
            raise ctx.error(f"activation '{name}' is not supported (supported: Sigmoid, Tanh, Relu)")
        codes.append(code)
    return tuple(tuple(codes[d * n:(d + 1) * n]) for d in range(directions))


def _shape(ctx: NodeContext, i: int | None, want: tuple[int, ...], what: str):
    if i is None or not ctx.has_input(i):
        return
    t = ctx.type(i)
    if tuple(t.shape) != tuple(want):
        raise ctx.error(f"input {i} ('{what}') must have shape {list(want)}, got {list(t.shape)}")
    if t.dtype != ctx.type(0).dtype:
        raise ctx.error(f"input {i} ('{what}') must have X's element type {ctx.type(0).dtype}, got {t.dtype}")


def rnn_geometry(ctx: NodeContext) -> Geometry:
    """The sizes of a recurrent node (forward, training or gradient op; ``input_at`` says where each input
    sits), with every input shape checked."""
    cell = CELLS[CELL_OF[ctx.node.op_type]]
    if ctx.attr("clip") is not None:
        raise ctx.error("attribute 'clip' is not supported (export without cell clipping)")
    if cell.name == "LSTM" and ctx.attr("input_forget"):
        raise ctx.error("input_forget=1 (coupled input and forget gates) is not supported")
    x, r = ctx.shape(0), ctx.shape(2)
    if len(x) != 3:
        raise ctx.error("X must be 3-D ([seq_length, batch_size, input_size], or batch first with layout=1); "
                        f"got shape {list(x)}")
    layout = ctx.attr("layout")
    seq, batch = (x[0], x[1]) if layout == 0 else (x[1], x[0])
    direction = ctx.attr("direction")
    d = 2 if direction == "bidirectional" else 1
    if len(r) != 3:
        raise ctx.error(f"R must be 3-D ([num_directions, {cell.gates}*hidden_size, hidden_size]); "
                        f"got {list(r)}")
    hidden = r[2]
    if ctx.attr("hidden_size") is not None and ctx.attr("hidden_size") != hidden:
        raise ctx.error(f"hidden_size {ctx.attr('hidden_size')} differs from R's last dim {hidden}")
    g = cell.gates
    at = input_at(ctx.node.op_type)
    _shape(ctx, 1, (d, g * hidden, x[2]), "W")
    _shape(ctx, 2, (d, g * hidden, hidden), "R")
    _shape(ctx, at.get("B"), (d, 2 * g * hidden), "B")
    if ctx.has_input(at["SL"]):
        sl = ctx.type(at["SL"])
        if tuple(sl.shape) != (batch,) or sl.dtype != np.int32:
            raise ctx.error(f"sequence_lens must be int32 of shape [{batch}], got {sl}")
    state = (d, batch, hidden) if layout == 0 else (batch, d, hidden)
    _shape(ctx, at["H0"], state, "initial_h")
    if cell.name == "LSTM":
        _shape(ctx, at["C0"], state, "initial_c")
        _shape(ctx, at["P"], (d, 3 * hidden), "P")
    reverse = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}[direction]
    lbr = bool(ctx.attr("linear_before_reset")) if cell.name == "GRU" else False
    return Geometry(cell, seq, batch, x[2], hidden, d, layout, _activations(ctx, cell, d), reverse, lbr)


def _forward(ctx: NodeContext):
    g = rnn_geometry(ctx)
    dtype = ctx.type(0).dtype
    outs = [TensorType(dtype, g.y_shape())] + [TensorType(dtype, g.state_shape())] * g.cell.states
    return outs[:max(1, len(ctx.node.outputs))]


def _training(ctx: NodeContext):
    """LSTMTraining: Y, Y_h, Y_c, CAll, IOFC; GRUTraining: Y, Y_h, ZRH."""
    g = rnn_geometry(ctx)
    dtype = ctx.type(0).dtype
    if g.cell.name == "LSTM":
        saved = [TensorType(dtype, g.saved_shape(1)), TensorType(dtype, g.saved_shape(4))]
    else:
        saved = [TensorType(dtype, g.saved_shape(3))]
    outs = [TensorType(dtype, g.y_shape())] + [TensorType(dtype, g.state_shape())] * g.cell.states + saved
    if len(ctx.node.outputs) > len(outs):
        raise ctx.error(f"has {len(ctx.node.outputs)} outputs; {ctx.node.op_type} has at most {len(outs)}")
    return outs[:len(ctx.node.outputs)]


# Where each input sits. The forward and training ops take ONNX's order; a gradient op takes the forward
# inputs it reads, the saved outputs (HAll = Y, and the rest) and the incoming gradients. LSTMGrad is
# onnxruntime's (1.19): no B (the gates' saved activations make it unneeded) and no P; edgetrain appends P as
# a 13th input only for an LSTM with peepholes, which onnxruntime's LSTM kernels do not train.
INPUTS = {"forward": ("X", "W", "R", "B", "SL", "H0", "C0", "P"),
          "LSTMGrad": ("X", "W", "R", "SL", "H0", "C0", "HAll", "CAll", "IOFC", "dY", "dY_h", "dY_c", "P"),
          "GRUGrad": ("X", "W", "R", "B", "SL", "H0", "HAll", "ZRH", "dY", "dY_h"),
          "RNNGrad": ("X", "W", "R", "B", "SL", "H0", "HAll", "dY", "dY_h")}
SAVED = {"LSTMGrad": ("HAll", "CAll", "IOFC"), "GRUGrad": ("HAll", "ZRH"), "RNNGrad": ("HAll",)}
_INPUT_AT = {op: {name: i for i, name in enumerate(names)} for op, names in INPUTS.items()}


def input_at(op_type: str) -> dict[str, int]:
    """{input name: position} of a recurrent op (names as in ``INPUTS``)."""
    return _INPUT_AT.get(op_type, _INPUT_AT["forward"])


GRAD_OUTPUTS = {"LSTMGrad": ("dX", "dW", "dR", "dB", "dH0", "dC0", "dP"),
                "GRUGrad": ("dX", "dW", "dR", "dB", "dH0"), "RNNGrad": ("dX", "dW", "dR", "dB", "dH0")}


def _grad(ctx: NodeContext):
    g = rnn_geometry(ctx)
    dtype = ctx.type(0).dtype
    at = input_at(ctx.node.op_type)
    saved = {"HAll": g.y_shape(), "CAll": g.saved_shape(1), "IOFC": g.saved_shape(4), "ZRH": g.saved_shape(3),
             "dY": g.y_shape(), "dY_h": g.state_shape(), "dY_c": g.state_shape()}
    for what, i in at.items():
        if what not in saved:
            continue
        required = what in ("HAll", "CAll", "IOFC", "ZRH")
        if required and not ctx.has_input(i):
            raise ctx.error(f"input {i} ('{what}') is required")
        _shape(ctx, i, saved[what], what)
    outs = GRAD_OUTPUTS[ctx.node.op_type]
    if len(ctx.node.outputs) > len(outs):
        raise ctx.error(f"has {len(ctx.node.outputs)} outputs; {ctx.node.op_type} has at most {len(outs)}")
    gh, state = g.gates * g.hidden, TensorType(dtype, g.state_shape())
    types = [ctx.type(0), TensorType(dtype, (g.directions, gh, g.inputs)),
             TensorType(dtype, (g.directions, gh, g.hidden)), TensorType(dtype, (g.directions, 2 * gh)),
             state, state, TensorType(dtype, (g.directions, 3 * g.hidden))]
    return types[:len(ctx.node.outputs)]


def _rnn_workspace(ctx: NodeContext):
    """Scratch of ``kernels.rnn`` forward: the input projections of every step and direction [T*B, D*G*H], the
    recurrent projection of one step [B, G*H], the running state h (and c) [B, H]; GRU without
    linear_before_reset also r * h [B, H]."""
    g = rnn_geometry(ctx)
    dtype = ctx.type(0).dtype
    gh = g.gates * g.hidden
    ws = [TensorType(dtype, (g.seq * g.batch, g.directions * gh)), TensorType(dtype, (g.batch, gh)),
          TensorType(dtype, (g.batch, g.hidden)), TensorType(dtype, (g.batch, g.hidden))]
    return ws


def _grad_workspace(ctx: NodeContext):
    """Scratch of ``kernels.rnn`` gradients: the gates' pre-activation gradients of every step and direction
    [T*B, D*G*H] (rows in X's order), the previous states [T*B, H] (LSTM: also the previous cell states; GRU:
    Rh h + Rbh or r * h), the running dh and dc and one step's recurrent product [B, H]; GRU also the
    gradients its recurrent weights see [T*B, D*G*H] (its candidate gate's differ from its input weights')."""
    g = rnn_geometry(ctx)
    dtype = ctx.type(0).dtype
    rows, gh = g.seq * g.batch, g.gates * g.hidden
    state = TensorType(dtype, (g.batch, g.hidden))
    ws = [TensorType(dtype, (rows, g.directions * gh)), TensorType(dtype, (rows, g.hidden)),
          TensorType(dtype, (rows, g.hidden)), state, state, state]
    if g.cell.name == "GRU":
        ws.append(TensorType(dtype, (rows, g.directions * gh)))
    return ws


# --- training forms and gradient rules --------------------------------------------------------------------

def _train_form(op_type: str, n_out: int):
    """The node as its com.microsoft training op with every output; layout=0 is dropped as onnxruntime drops
    it (its LSTMTraining/GRUTraining schemas have no layout attribute)."""
    def form(node, opset):
        from ..ir import Node
        outputs = (list(node.outputs) + [""] * n_out)[:n_out]
        attrs = {k: v for k, v in node.attrs.items() if k != "layout" or v != 0}
        return Node(op_type, list(node.inputs), outputs, attrs, node.name, MS)
    return form


def _grad_vjp(grad_op: str, domain: str, n_states: int):
    """The gradient op reads the forward inputs, the saved outputs (HAll and the rest: ``SAVED``), dY and the
    final states' gradients; it returns dX, dW, dR, dB, (nothing for sequence_lens), dH0 [, dC0, dP]."""
    n_saved = len(SAVED[grad_op])

    def vjp(g, dys):
        outs = list(g.node.outputs) + [""] * (1 + n_states + n_saved)
        dys = list(dys) + [None] * (1 + n_states + n_saved)
        states = list(range(1, 1 + n_states))
        saved = [outs[0]] + list(outs[1 + n_states:1 + n_states + n_saved - 1])
        for k in range(1 + n_states, len(g.node.outputs)):
            if dys[k] is not None:
                raise g.error(f"output {k} ('{outs[k]}') holds saved activations and has no gradient")
        if any(not s for s in saved):
            raise g.error("needs its saved outputs (edgetrain.autodiff.prepare_for_training adds them)")
        given = dict(zip(INPUTS["forward"], g.node.inputs))
        given.update(zip(SAVED[grad_op], saved))
        given.update(zip(("dY", "dY_h", "dY_c"), [dys[0]] + [dys[s] for s in states]))
        inputs = [given.get(name) or "" for name in INPUTS[grad_op]]
        if grad_op == "LSTMGrad" and not inputs[-1]:
            inputs.pop()        # onnxruntime's 12 inputs: P only for peepholes (see INPUTS)
        n_in = len(INPUTS["forward"])
        needs = list(g.needs) + [False] * n_in
        grads = [needs[0], needs[1], needs[2], needs[3], needs[5]] + \
            ([needs[6], needs[7]] if grad_op == "LSTMGrad" else [])
        label = g.node.name or g.y()
        names = [f"{label}_Grad/{grad_op}_{what}" if want else ""
                 for want, what in zip(grads, GRAD_OUTPUTS[grad_op])]
        while names and not names[-1]:
            names.pop()
        if not names:
            return [None] * len(g.node.inputs)
        g.emit(grad_op, inputs, dict(g.node.attrs), domain, outputs=names, n_out=len(names))
        names += [""] * (len(grads) - len(names))
        result = names[:4] + [""] + names[4:]
        return [r or None for r in result]
    return vjp


LSTM_ATTRS = RNN_ATTRS | {"input_forget": Flag(0)}
GRU_ATTRS = RNN_ATTRS | {"linear_before_reset": Flag(0)}
RNN_DEFAULTS = RNN_ATTRS | {"activations": Strings(("Tanh", "Tanh"))}

OPS = (
    OpDef("GRU", _forward, since=14, kernel="rnn.gru", workspace=_rnn_workspace, attrs=GRU_ATTRS,
          train_form=_train_form("GRUTraining", 3),
          doc="all directions, layouts 0/1, initial_h, sequence_lens; trains as com.microsoft GRUTraining"),
    OpDef("GRUGrad", _grad, domain=MS, since=1, kernel="rnn.gru_grad", workspace=_grad_workspace,
          attrs=GRU_ATTRS, doc="inputs X, W, R, B, sequence_lens, initial_h, HAll, ZRH, dHAll, dHt; "
                               "outputs dX, dW, dR, dB, dH0"),
    OpDef("GRUTraining", _training, domain=MS, since=1, kernel="rnn.gru", workspace=_rnn_workspace,
          attrs=GRU_ATTRS, vjp=_grad_vjp("GRUGrad", MS, 1), grad_outputs=3,
          doc="GRU that also outputs the gate activations ZRH [T, D, B, 3H] (z, r, ht~)"),
    OpDef("LSTM", _forward, since=14, kernel="rnn.lstm", workspace=_rnn_workspace, attrs=LSTM_ATTRS,
          train_form=_train_form("LSTMTraining", 5),
          doc="all directions, layouts 0/1, initial_h/initial_c, sequence_lens, peepholes; trains as "
              "com.microsoft LSTMTraining"),
    OpDef("LSTMGrad", _grad, domain=MS, since=1, kernel="rnn.lstm_grad", workspace=_grad_workspace,
          attrs=LSTM_ATTRS, doc="inputs X, W, R, sequence_lens, initial_h, initial_c, HAll, CAll, IOFC, "
                                "dHAll, dHt, dCt (onnxruntime 1.19's), P (edgetrain's, for peepholes); "
                                "outputs dX, dW, dR, dB, dH0, dC0, dP"),
    OpDef("LSTMTraining", _training, domain=MS, since=1, kernel="rnn.lstm", workspace=_rnn_workspace,
          attrs=LSTM_ATTRS, vjp=_grad_vjp("LSTMGrad", MS, 2), grad_outputs=5,
          doc="LSTM that also outputs every cell state CAll [T, D, B, H] and the gate activations IOFC "
              "[T, D, B, 4H]"),
    OpDef("RNN", _forward, since=14, kernel="rnn.rnn", workspace=_rnn_workspace, attrs=RNN_DEFAULTS,
          vjp=_grad_vjp("RNNGrad", EDGETRAIN, 1), grad_outputs=1,
          doc="all directions, layouts 0/1, initial_h, sequence_lens; gradient ai.edgetrain RNNGrad"),
    OpDef("RNNGrad", _grad, domain=EDGETRAIN, since=1, kernel="rnn.rnn_grad", workspace=_grad_workspace,
          attrs=RNN_DEFAULTS, doc="inputs X, W, R, B, sequence_lens, initial_h, Y, dY, dY_h; outputs dX, dW, "
                               "dR, dB, dH0"),
)
