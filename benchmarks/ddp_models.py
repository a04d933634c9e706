"""Models and synthetic batches for benchmark.py, none of which needs a download.

`build(name, opts)` returns a `Workload`: the module, a function making one
synthetic (inputs, target) batch from a torch.Generator, and a description
for the header. Every model ends in class logits trained with cross-entropy,
so the trainer needs no per-model code.

  resnet50     ResNet-50's layout (bottleneck stages of 3/4/6/3 blocks, 25.6M
               parameters, the size PyTorch's DDP benchmark communicates) on
               --image-size inputs: the parameter count, hence the bytes DDP
               reduces per step, does not depend on the image size, so small
               images keep the communication and cut the CPU's compute.
  transformer  pre-norm encoder blocks over --seq-len tokens with a
               next-token head.
  mlp          fully connected layers (little compute per parameter: the
               communication-bound case).
  torchvision.NAME  any torchvision.models constructor, when torchvision is
               installed (torchvision.resnet50 is the model PyTorch's
               benchmark uses).
"""
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

MODELS = ("resnet50", "transformer", "mlp", "torchvision.NAME")


@dataclass
class Workload:
    model: nn.Module
    make_batch: Callable[[torch.Generator], tuple]  # -> (inputs, target), on the CPU
    describe: str


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride), 1x1 expand x4, plus a shortcut
    that is projected when the shape changes."""

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet50_layout(classes=1000):
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for b in range(blocks):
            stride = 2 if b == 0 and i > 0 else 1
            layers.append(Bottleneck(cin, width, stride))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class TinyLM(nn.Module):
    """Token embedding, pre-norm transformer encoder blocks, next-token head."""

    def __init__(self, vocab, dim, layers, heads, seq_len):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        h = self.blocks(self.embed(tokens) + self.pos[: tokens.shape[1]])
        return self.head(self.norm(h)).flatten(0, 1)  # (batch * seq, vocab) for cross-entropy


def build(name, batch_size, image_size=224, seq_len=128, classes=1000):
    """The model is created under the caller's RNG state: seed before calling
    to get identical initial parameters in every run."""
    if name == "resnet50":
        return Workload(
            resnet50_layout(classes),
            lambda g: (torch.rand(batch_size, 3, image_size, image_size, generator=g),
                       torch.randint(0, classes, (batch_size,), generator=g)),
            f"ResNet-50 layout (built in), {image_size}x{image_size} images")
    if name == "transformer":
        vocab, dim, layers, heads = 8192, 512, 4, 8
        return Workload(
            TinyLM(vocab, dim, layers, heads, seq_len),
            # target = the next token of the same random sequence
            lambda g: _shifted(torch.randint(0, vocab, (batch_size, seq_len + 1), generator=g)),
            f"transformer, {layers} blocks x d{dim} x {heads} heads, vocab {vocab}, {seq_len} tokens")
    if name == "mlp":
        width, depth, features = 2048, 4, 1024
        layers = [nn.Linear(features, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return Workload(
            nn.Sequential(*layers, nn.Linear(width, classes)),
            lambda g: (torch.randn(batch_size, features, generator=g),
                       torch.randint(0, classes, (batch_size,), generator=g)),
            f"MLP, {depth} hidden layers x {width}, {features} inputs")
    if name.startswith("torchvision."):
        try:
            import torchvision
        except ImportError:
            raise SystemExit(f"--model {name} needs torchvision (pip install torchvision)") from None
        arch = name.split(".", 1)[1]
        return Workload(
            torchvision.models.get_model(arch, num_classes=classes),
            lambda g: (torch.rand(batch_size, 3, image_size, image_size, generator=g),
                       torch.randint(0, classes, (batch_size,), generator=g)),
            f"torchvision {arch}, {image_size}x{image_size} images")
    raise SystemExit(f"unknown --model {name!r}; choose from {', '.join(MODELS)}")


def _shifted(tokens):
    return tokens[:, :-1], tokens[:, 1:].flatten()
