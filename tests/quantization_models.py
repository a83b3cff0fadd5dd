"""Models and data shared by tests/test_quantization_pt2e.py and its PyTorch reference script
(tests/scripts/pt2e_reference.py): built from either module, flambeau or torch."""
import numpy as np


def build_cnn(m):
    class CNN(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = m.nn.Conv2d(3, 8, 3, padding=1)
            self.c2 = m.nn.Conv2d(8, 16, 3, padding=1)
            self.fc = m.nn.Linear(16 * 4 * 4, 10)

        def forward(self, x):
            x = m.nn.functional.max_pool2d(m.relu(self.c1(x)), 2)
            x = m.nn.functional.max_pool2d(m.relu(self.c2(x)), 2)
            return self.fc(x.flatten(1))
    return CNN()


def build_cnn_bn(m):
    """build_cnn with a batch norm after each convolution (the second convolution without a bias), its
    affine parameters and running statistics set from a fixed seed (PT2E folds them into the weights)."""
    class CNNBN(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = m.nn.Conv2d(3, 8, 3, padding=1), m.nn.BatchNorm2d(8)
            self.c2, self.b2 = m.nn.Conv2d(8, 16, 3, padding=1, bias=False), m.nn.BatchNorm2d(16)
            self.fc = m.nn.Linear(16 * 4 * 4, 10)

        def forward(self, x):
            x = m.nn.functional.max_pool2d(m.relu(self.b1(self.c1(x))), 2)
            x = m.nn.functional.max_pool2d(m.relu(self.b2(self.c2(x))), 2)
            return self.fc(x.flatten(1))
    return _set_bn_statistics(CNNBN(), m, seed=5)


def build_pool_cnn(m):
    """conv -> ReLU module -> max pool, then two branches (conv -> ReLU, a 1x1 conv) concatenated, a padded
    3x3/2 max pool, nn.Flatten and a linear classifier: X86InductorQuantizer propagates int8 through the
    pools, the cat and the flatten (shared observers)."""
    class PoolCNN(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.r1, self.p1 = m.nn.Conv2d(3, 8, 3, padding=1), m.nn.ReLU(), m.nn.MaxPool2d(2)
            self.c2, self.r2, self.c3 = m.nn.Conv2d(8, 8, 3, padding=1), m.nn.ReLU(), m.nn.Conv2d(8, 8, 1)
            self.p2, self.flat, self.fc = m.nn.MaxPool2d(3, 2, 1), m.nn.Flatten(), m.nn.Linear(16 * 4 * 4, 10)

        def forward(self, x):
            x = self.p1(self.r1(self.c1(x)))
            return self.fc(self.flat(self.p2(m.cat([self.r2(self.c2(x)), self.c3(x)], 1))))
    return PoolCNN()


def build_avg_cnn(m):
    """conv -> ReLU module -> nn.AvgPool2d(2), conv -> ReLU module -> F.avg_pool2d(3, 2, 1,
    count_include_pad=False), conv -> nn.AdaptiveAvgPool2d((1, 1)) -> torch.flatten(x, 1) -> linear (ResNet's
    head): X86InductorQuantizer propagates int8 through the three average pools and the flatten."""
    class AvgCNN(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.r1, self.p1 = m.nn.Conv2d(3, 16, 3, padding=1), m.nn.ReLU(), m.nn.AvgPool2d(2)
            self.c2, self.r2 = m.nn.Conv2d(16, 16, 3, padding=1), m.nn.ReLU()
            self.c3, self.gap = m.nn.Conv2d(16, 32, 3, padding=1), m.nn.AdaptiveAvgPool2d((1, 1))
            self.fc = m.nn.Linear(32, 10)

        def forward(self, x):
            x = self.p1(self.r1(self.c1(x)))
            x = m.nn.functional.avg_pool2d(self.r2(self.c2(x)), 3, 2, 1, count_include_pad=False)
            return self.fc(m.flatten(self.gap(self.c3(x)), 1))
    return AvgCNN()


def build_flatten_cnn(m, how):
    """conv -> ReLU module -> max pool -> a functional flatten (`how`: "flatten" torch.flatten(x, 1),
    "method" x.flatten(1), "view" x.view(x.size(0), -1)) -> linear."""
    class FlattenCNN(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.r1, self.p1 = m.nn.Conv2d(3, 8, 3, padding=1), m.nn.ReLU(), m.nn.MaxPool2d(2)
            self.fc = m.nn.Linear(8 * 8 * 8, 10)

        def forward(self, x):
            x = self.p1(self.r1(self.c1(x)))
            x = {"flatten": lambda: m.flatten(x, 1), "method": lambda: x.flatten(1),
                 "view": lambda: x.view(x.size(0), -1)}[how]()
            return self.fc(x)
    return FlattenCNN()


def qdq_pattern(graph, kind):
    """The converted graph's q/dq pattern around its operators: "kind:dq:q" for each call whose `kind(node)`
    names it (conv, linear, max_pool, avg_pool, flatten, ...), dq whether its first input is a dequantize, q
    whether its (values) output's only user is a quantize."""
    def named(n, word):
        return n.op == "call_function" and word in str(n.target)
    out = []
    for n in graph.nodes:
        k = kind(n) if n.op == "call_function" else None
        if k is None:
            continue
        users = list(n.users)
        if users and all(named(u, "getitem") for u in users):
            users = [v for u in users if u.args[1] == 0 for v in u.users]
        dq = bool(n.args) and hasattr(n.args[0], "op") and named(n.args[0], "dequantize")
        q = len(users) == 1 and named(users[0], "quantize_per_tensor") and not named(users[0], "dequantize")
        out.append(f"{k}:{int(dq)}:{int(q)}")
    return out


def build_mlp(m, d_in=20, hidden=64, classes=4, skip=True):
    class MLP(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = m.nn.Linear(d_in, hidden), m.nn.Linear(hidden, hidden)
            self.l3 = m.nn.Linear(hidden, classes)

        def forward(self, x):
            h = m.relu(self.l2(m.relu(self.l1(x))))
            return self.l3(h + x.sum(1, keepdim=True) if skip else h)
    return MLP()


def build_mlp_bn(m, d_in=20, hidden=32, classes=4):
    """Linear -> BatchNorm1d -> ReLU twice (the second linear without a bias) and a classifier: PT2E folds
    the batch norms into the linear layers (2-D inputs)."""
    class MLPBN(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.b1 = m.nn.Linear(d_in, hidden), m.nn.BatchNorm1d(hidden)
            self.l2, self.b2 = m.nn.Linear(hidden, hidden, bias=False), m.nn.BatchNorm1d(hidden)
            self.l3 = m.nn.Linear(hidden, classes)

        def forward(self, x):
            return self.l3(m.relu(self.b2(self.l2(m.relu(self.b1(self.l1(x)))))))
    return _set_bn_statistics(MLPBN(), m, seed=9)


def calibration(shape, n_batches=3, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * (1 + i)).astype(np.float32) for i in range(n_batches)]


def build_qat_cnn(m):
    """conv -> batch norm -> ReLU twice (the second convolution without a bias), a spatial mean and a
    linear classifier: the model QAT conv-bn fusion is tested on (ReLU as a module, as PyTorch's
    quantizer requires to annotate its output)."""
    class QATCNN(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1, self.r1 = m.nn.Conv2d(3, 8, 3, padding=1), m.nn.BatchNorm2d(8), m.nn.ReLU()
            self.c2, self.b2, self.r2 = m.nn.Conv2d(8, 8, 3, bias=False), m.nn.BatchNorm2d(8), m.nn.ReLU()
            self.fc = m.nn.Linear(8, 4)

        def forward(self, x):
            x = self.r2(self.b2(self.c2(self.r1(self.b1(self.c1(x))))))
            return self.fc(x.mean((2, 3)))
    return _set_bn_statistics(QATCNN(), m, seed=7)


def build_qat_res(m):
    """conv -> bn -> ReLU, then conv -> bn + identity -> ReLU (ResNet's basic block, ReLU modules), a spatial
    mean and a linear classifier: PyTorch's QAT conv-bn-add-relu annotation (the identity observed)."""
    class QATRes(m.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1, self.r1 = m.nn.Conv2d(3, 8, 3, padding=1), m.nn.BatchNorm2d(8), m.nn.ReLU()
            self.c2, self.b2, self.r2 = m.nn.Conv2d(8, 8, 3, padding=1, bias=False), m.nn.BatchNorm2d(8), m.nn.ReLU()
            self.fc = m.nn.Linear(8, 4)

        def forward(self, x):
            y = self.r1(self.b1(self.c1(x)))
            return self.fc(self.r2(self.b2(self.c2(y)) + y).mean((2, 3)))
    return _set_bn_statistics(QATRes(), m, seed=11)


def _set_bn_statistics(model, m, seed):
    rng = np.random.default_rng(seed)
    for bn in (model.b1, model.b2):
        n = bn.num_features
        for name, value in (("weight", rng.uniform(0.5, 2, n)), ("bias", rng.standard_normal(n) * 0.3),
                            ("running_mean", rng.standard_normal(n) * 0.2), ("running_var", rng.uniform(0.3, 3, n))):
            getattr(bn, name).data.copy_(m.tensor(value.astype(np.float32)))
    return model


def qat_batches(n=6, batch=8, seed=3):
    """(input, class) batches QAT trains build_qat_cnn on: labels from the sign pattern of the mean of
    two input channels, so the loss moves."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((batch, 3, 10, 10)).astype(np.float32)
        m = x.mean((2, 3))
        out.append((x, ((m[:, 0] > 0) * 2 + (m[:, 1] > 0)).astype(np.int64)))
    return out
