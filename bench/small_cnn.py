"""A small ResNet-like CNN for the garbage-collector benchmark (bench/gc_step.py) and tests
(tests/test_compile_retention.py, tests/test_gc_garbage.py): the ops of ResNet-50's training step
(conv, BatchNorm, ReLU, max-pool, residual adds, average pool, Linear, cross entropy) at a CPU size.

Written once for flambeau and torch (`lib` is either module); `forward(x, targets)` returns the loss.
"""
from __future__ import annotations


def small_cnn(lib, *, channels: int = 4, blocks: int = 1, classes: int = 5):
    """A fresh CNN of `lib`: a conv-BatchNorm-ReLU stem and a 3x3/2 max-pool, `blocks` residual blocks of
    two 3x3 conv-BatchNorm, global average pool, Linear to `classes`; input (N, 3, H, W)."""
    nn, F = lib.nn, lib.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
            self.c2, self.b2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)

        def forward(self, x):
            return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + x)

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
            self.pool = nn.MaxPool2d(3, 2, 1)
            self.blocks = nn.Sequential(*[Block() for _ in range(blocks)])
            self.fc = nn.Linear(channels, classes)

        def forward(self, x, targets):
            x = self.blocks(self.pool(F.relu(self.bn(self.conv(x)))))
            return F.cross_entropy(self.fc(lib.flatten(F.adaptive_avg_pool2d(x, 1), 1)), targets)
    return CNN()
