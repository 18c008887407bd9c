"""Small versions of the architectures users export from PyTorch (issue 13, item 2), each with its sample batch
and loss: built here, exported by the test with torch's legacy (TorchScript) or default (dynamo) exporter."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Workload:
    name: str
    model: object                 # a torch.nn.Module in training mode
    inputs: dict[str, np.ndarray]
    labels: np.ndarray
    loss: str                     # edgetrain.artifacts.LossType member name
    dynamic: dict[str, dict[int, str]]   # input -> {axis: name}: the axes exported as dynamic
    opset: int | None = None      # the dynamo exporter's opset (None: its default)


def _cnn(torch, nn, rng):
    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.drop = nn.Dropout(0.25)
            self.fc = nn.Linear(8 * 7 * 7, 10)

        def forward(self, x):
            x = torch.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
            return self.fc(self.drop(x.flatten(1)))
    x = rng.standard_normal((6, 1, 14, 14)).astype(np.float32)
    return Workload("cnn_bn_dropout", CNN(), {"x": x}, np.arange(6) % 10, "CrossEntropyLoss", {"x": {0: "batch"}})


def _autoencoder(torch, nn, rng):
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
        nn.ConvTranspose2d(4, 1, 3, stride=2, padding=1, output_padding=1))
    x = rng.standard_normal((4, 1, 12, 12)).astype(np.float32)
    return Workload("conv_autoencoder", model, {"x": x}, x.copy(), "MSELoss", {"x": {0: "batch"}})


def _mobilenet(torch, nn, rng):
    def block(c_in, c_out, stride):
        return nn.Sequential(nn.Conv2d(c_in, c_in, 3, stride, 1, groups=c_in, bias=False), nn.BatchNorm2d(c_in),
                             nn.ReLU6(), nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU6())
    model = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(),
                          block(8, 16, 1), block(16, 24, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 5))
    x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    return Workload("mobilenet_style", model, {"x": x}, np.arange(4) % 5, "CrossEntropyLoss", {"x": {0: "batch"}})


def _gpt(torch, nn, rng):
    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            self.heads = heads

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / (c // self.heads) ** 0.5)
            causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
            att = att.masked_fill(causal, float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self, vocab=40, d=16, heads=2, layers=2, context=32):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
            self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight                  # tied embeddings

        def forward(self, idx):
            b, t = idx.shape
            x = self.tok(idx) + self.pos(torch.arange(t))
            return self.head(self.ln(self.blocks(x))).reshape(b * t, -1)
    idx = rng.integers(0, 40, (3, 8))
    return Workload("small_gpt", GPT(), {"idx": idx}, rng.integers(0, 40, 24), "CrossEntropyLoss",
                    {"idx": {0: "batch"}})


def _sdpa(torch, nn, rng):
    """A causal self-attention block through ``F.scaled_dot_product_attention``: at opset 23 the dynamo exporter
    writes ONNX's Attention op, which edgetrain runs through its function body (edgetrain.inline)."""
    class SDPA(nn.Module):
        def __init__(self, d=16, heads=2):
            super().__init__()
            # (in, out) weights used as x @ w: no transpose for the dynamo exporter to fold into a new constant
            self.w_qkv = nn.Parameter(0.3 * torch.randn(d, 3 * d))
            self.w_out = nn.Parameter(0.3 * torch.randn(d, 5))
            self.heads = heads

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (x @ self.w_qkv).split(c, 2))
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return (y.transpose(1, 2).reshape(b, t, c) @ self.w_out).reshape(b * t, -1)
    x = rng.standard_normal((3, 6, 16)).astype(np.float32)
    return Workload("sdpa_attention", SDPA(), {"x": x}, rng.integers(0, 5, 18), "CrossEntropyLoss", {}, opset=23)


def _recurrent(kind: str):
    """A 2-layer LSTM/GRU keyword or time-series classifier (batch first), reading the last step's output."""
    def make(torch, nn, rng):
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = getattr(nn, kind)(6, 12, num_layers=2, batch_first=True)
                self.fc = nn.Linear(12, 4)

            def forward(self, x):
                y, _ = self.rnn(x)
                return self.fc(y[:, -1])
        x = rng.standard_normal((5, 7, 6)).astype(np.float32)
        return Workload(f"{kind.lower()}_2layer", Net(), {"x": x}, np.arange(5) % 4, "CrossEntropyLoss",
                        {"x": {0: "batch"}})
    return make


BUILDERS = {"cnn_bn_dropout": _cnn, "conv_autoencoder": _autoencoder, "mobilenet_style": _mobilenet,
            "small_gpt": _gpt, "sdpa_attention": _sdpa, "lstm_2layer": _recurrent("LSTM"),
            "gru_2layer": _recurrent("GRU")}


def build(name: str, seed: int = 0) -> Workload:
    import torch
    from torch import nn
    torch.manual_seed(seed)
    return BUILDERS[name](torch, nn, np.random.default_rng(seed))


def export(w: Workload, path, exporter: str) -> None:
    """Write ``w.model`` (in training mode) with torch's ``legacy`` or ``dynamo`` exporter."""
    import torch
    args = tuple(torch.from_numpy(v) for v in w.inputs.values())
    names = list(w.inputs)
    w.model.train()
    if exporter == "legacy":
        torch.onnx.export(w.model, args, str(path), dynamo=False, input_names=names, output_names=["output"],
                          dynamic_axes=w.dynamic, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False)
    else:
        shapes = tuple({axis: torch.export.Dim(label) for axis, label in w.dynamic.get(k, {}).items()}
                       for k in names)
        torch.onnx.export(w.model, args, str(path), dynamo=True, input_names=names, output_names=["output"],
                          dynamic_shapes=shapes, verbose=False, opset_version=w.opset)
