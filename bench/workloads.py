"""Realistic on-device training jobs for bench/train.py (issue 14, item 4), built in code with torch and exported.

    build(name, tiny=False) -> Workload      # the torch model (weights fixed by the seed), its batch and loss
    export(workload, path)                   # the forward ONNX (opset 17, torch's TorchScript exporter)
    params(workload, graph_initializers)     # (trainable, frozen) initializer names for generate_artifacts

Nothing here is checked in as a model file: every run builds the same weights from the same seed, so the torch
column of the bench rebuilds the model instead of reading weights back. ``tiny`` keeps each architecture's
kinds of layers at a size a unit test can train in seconds (tests/test_bench.py).

- mobilenetv2_frozen: MobileNetV2 (width 1.0) on 3x224x224, 10 classes, batch 8; trains the classifier, the
  backbone frozen with its BatchNorm in inference mode.
- mobilenetv2_last: the same, also training the last two inverted-residual blocks and the last 1x1 conv (their
  BatchNorm in training mode).
- kws: DS-CNN keyword spotting (Conv 10x4 s2 + 4 depthwise-separable blocks, 64 channels) on 1x49x10 MFCC,
  12 classes, batch 32.
- lstm / gru: one LSTM / GRU layer (40 -> 64) over 49 frames of 40 MFCC, last state -> 12 classes, batch 16.
- gpt: 4 pre-LN blocks, d 128, 4 heads, context 64, byte vocabulary (256), tied embeddings, `arange` positions,
  triu causal mask, dynamic batch (8), labels [N*T].
- resnet18: ResNet-18 (7x7 s2 stem, max pool) on 3x64x64, 10 classes, batch 8.
- autoencoder: Conv s2 x3 (3->16->32->64) and ConvTranspose s2 x3 back on 3x64x64, MSE, batch 16.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

NAMES = ["mobilenetv2_frozen", "mobilenetv2_last", "kws", "lstm", "gru", "gpt", "resnet18", "autoencoder"]
SEED = 0


@dataclass
class Workload:
    name: str
    model: object                      # torch.nn.Module, modes set (frozen parts in eval mode)
    x: np.ndarray                      # the one fixed batch
    y: np.ndarray                      # int64 class labels, or the float target of an MSE loss
    loss: str                          # edgetrain.artifacts.LossType member name (ORT's has the same)
    dynamic: dict = field(default_factory=dict)     # exported dynamic axes: {input: {axis: name}}
    classes: int = 10


# -- architectures (written here from the papers' tables; torch only as a layer library) ------------------------
def _mobilenet_v2(nn, width: float, repeats_cap: int | None, classes: int):
    stages = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
              (6, 320, 1, 1)]        # expansion, channels, repeats, first stride (Sandler et al. 2018, table 2)

    def ch(v):
        return max(8, int(v * width + 4) // 8 * 8)

    def cbr(c_in, c_out, k, s, groups=1):
        return [nn.Conv2d(c_in, c_out, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(c_out), nn.ReLU6()]

    class Inverted(nn.Module):
        def __init__(self, c_in, c_out, stride, t):
            super().__init__()
            hidden = c_in * t
            layers = ([] if t == 1 else cbr(c_in, hidden, 1, 1)) + cbr(hidden, hidden, 3, stride, hidden)
            self.body = nn.Sequential(*layers, nn.Conv2d(hidden, c_out, 1, bias=False), nn.BatchNorm2d(c_out))
            self.residual = stride == 1 and c_in == c_out

        def forward(self, x):
            y = self.body(x)
            return x + y if self.residual else y

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            blocks, c_in = [nn.Sequential(*cbr(3, ch(32), 3, 2))], ch(32)
            for t, c, n, s in stages:
                for k in range(min(n, repeats_cap or n)):
                    blocks.append(Inverted(c_in, ch(c), s if k == 0 else 1, t))
                    c_in = ch(c)
            last = 1280 if width >= 1 else ch(256)
            blocks.append(nn.Sequential(*cbr(c_in, last, 1, 1)))
            self.features = nn.Sequential(*blocks)
            self.classifier = nn.Linear(last, classes)

        def forward(self, x):
            return self.classifier(self.features(x).mean((2, 3)))
    return MobileNetV2()


def _freeze(model, trainable_modules) -> None:
    """Transfer learning: everything outside ``trainable_modules`` frozen, its BatchNorm in inference mode."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    for m in trainable_modules:
        m.train()
        for p in m.parameters():
            p.requires_grad_(True)


def _mobilenet(torch, nn, rng, tiny, last_blocks: bool):
    model = _mobilenet_v2(nn, 0.25 if tiny else 1.0, 1 if tiny else None, 10)
    _freeze(model, [*model.features[-3:], model.classifier] if last_blocks else [model.classifier])
    size, batch = (32, 2) if tiny else (224, 8)
    x = rng.standard_normal((batch, 3, size, size), dtype=np.float32)
    return model, x, rng.integers(0, 10, batch), "CrossEntropyLoss", {}, 10


def _kws(torch, nn, rng, tiny):
    width, blocks, batch = (8, 1, 2) if tiny else (64, 4, 32)

    def bnr(conv, c):
        return [conv, nn.BatchNorm2d(c), nn.ReLU()]
    layers = bnr(nn.Conv2d(1, width, (10, 4), (2, 2), (5, 1), bias=False), width)
    for _ in range(blocks):
        layers += bnr(nn.Conv2d(width, width, 3, 1, 1, groups=width, bias=False), width)
        layers += bnr(nn.Conv2d(width, width, 1, bias=False), width)
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 12))
    x = rng.standard_normal((batch, 1, 49, 10), dtype=np.float32)
    return model, x, rng.integers(0, 12, batch), "CrossEntropyLoss", {}, 12


def _recurrent(torch, nn, rng, tiny, cell: str):
    frames, features, hidden, batch = (5, 4, 8, 2) if tiny else (49, 40, 64, 16)

    class Sequence(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(nn, cell)(features, hidden, batch_first=True)
            self.head = nn.Linear(hidden, 12)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])
    x = rng.standard_normal((batch, frames, features), dtype=np.float32)
    return Sequence(), x, rng.integers(0, 12, batch), "CrossEntropyLoss", {}, 12


def _gpt(torch, nn, rng, tiny):
    vocab, d, heads, layers, context, batch = (32, 16, 2, 1, 8, 2) if tiny else (256, 128, 4, 4, 64, 8)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / (c // heads) ** 0.5)
            causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
            att = att.masked_fill(causal, float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight

        def forward(self, idx):
            b, t = idx.shape
            x = self.tok(idx) + self.pos(torch.arange(t))
            return self.head(self.ln(self.blocks(x))).reshape(b * t, -1)
    x = rng.integers(0, vocab, (batch, context))
    y = rng.integers(0, vocab, batch * context)
    return GPT(), x, y, "CrossEntropyLoss", {"input": {0: "N"}}, vocab


def _resnet18(torch, nn, rng, tiny):
    widths, repeats, size, batch = ((4, 8, 16, 32), 1, 16, 2) if tiny else ((64, 128, 256, 512), 2, 64, 8)

    class Basic(nn.Module):
        def __init__(self, c_in, c_out, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(c_out)
            self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(c_out)
            self.down = None if stride == 1 and c_in == c_out else nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

        def forward(self, x):
            y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    c_in = widths[0]
    for k, c in enumerate(widths):
        for r in range(repeats):
            layers.append(Basic(c_in, c, 2 if k and not r else 1))
            c_in = c
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, 10))
    x = rng.standard_normal((batch, 3, size, size), dtype=np.float32)
    return model, x, rng.integers(0, 10, batch), "CrossEntropyLoss", {}, 10


def _autoencoder(torch, nn, rng, tiny):
    chans, size, batch = ((1, 4, 8, 8), 16, 2) if tiny else ((3, 16, 32, 64), 64, 16)
    enc, dec = [], []
    for a, b in zip(chans, chans[1:]):
        enc += [nn.Conv2d(a, b, 3, 2, 1), nn.ReLU()]
        dec = [nn.ConvTranspose2d(b, a, 3, 2, 1, output_padding=1), nn.ReLU()] + dec
    model = nn.Sequential(*enc, *dec[:-1])          # no activation after the last layer: an MSE regression
    x = rng.standard_normal((batch, chans[0], size, size), dtype=np.float32)
    return model, x, x.copy(), "MSELoss", {}, 0


BUILDERS = {"mobilenetv2_frozen": lambda *a: _mobilenet(*a, last_blocks=False),
            "mobilenetv2_last": lambda *a: _mobilenet(*a, last_blocks=True),
            "kws": _kws, "lstm": lambda *a: _recurrent(*a, "LSTM"), "gru": lambda *a: _recurrent(*a, "GRU"),
            "gpt": _gpt, "resnet18": _resnet18, "autoencoder": _autoencoder}


def _pretrained_statistics(torch, nn, model) -> None:
    """BatchNorm as a trained network has it (a fresh one is all ones and zeros, which the exporter collapses
    into one shared initializer behind Identity nodes, and which no frozen backbone has)."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)


def build(name: str, tiny: bool = False) -> Workload:
    """The workload ``name`` with its weights and batch drawn from the fixed seed (same call, same numbers)."""
    import torch
    from torch import nn
    if name not in BUILDERS:
        raise ValueError(f"unknown workload '{name}' (known: {', '.join(NAMES)})")
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    model, x, y, loss, dynamic, classes = BUILDERS[name](torch, nn, rng, tiny)
    _pretrained_statistics(torch, nn, model)
    if not any(m.training for m in model.modules()):
        raise AssertionError(f"{name}: nothing in training mode")
    if name not in ("mobilenetv2_frozen", "mobilenetv2_last"):
        model.train()
    return Workload(name, model, x, np.asarray(y, dtype=np.int64) if loss != "MSELoss" else y, loss, dynamic,
                    classes)


def export(w: Workload, path) -> None:
    """The forward model as ONNX (opset 17), each module exported in the mode it is in (frozen parts' BatchNorm in
    inference mode), weights as initializers named after the state dict."""
    import warnings

    import torch
    with warnings.catch_warnings():     # the exporter's notes on dropped in-place stat updates and RNN layouts
        warnings.simplefilter("ignore")
        _export(torch, w, path)


def _export(torch, w: Workload, path) -> None:
    torch.onnx.export(w.model, (torch.from_numpy(w.x),), str(path), dynamo=False, input_names=["input"],
                      output_names=["output"], dynamic_axes=w.dynamic, opset_version=17,
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)


def params(w: Workload, initializers) -> tuple[list[str], list[str]]:
    """(trainable, frozen) for generate_artifacts: the float initializers named like the state dict; trainable
    where the parameter requires a gradient. Other initializers (shapes, constants) stay model constants."""
    grads = {n for n, p in w.model.named_parameters() if p.requires_grad}
    state = {n for n, t in w.model.state_dict().items() if t.dtype.is_floating_point}
    named = [n for n in initializers if n in state]
    trainable = [n for n in named if n in grads]
    missing = grads - set(trainable)
    if missing:
        raise RuntimeError(f"{w.name}: trainable parameters {sorted(missing)} are not initializers of the export "
                           f"(initializers: {sorted(initializers)[:20]} ...)")
    return trainable, [n for n in named if n not in grads]
