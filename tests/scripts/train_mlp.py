"""A PyTorch training script as users write it (deterministic weights so any framework agrees)."""
import sys
import tempfile
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def main():
    torch.set_default_dtype(torch.float64)
    model = Net()
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            n = p.numel()
            p.copy_((torch.arange(n, dtype=torch.float64).reshape(p.shape) * 0.37 + i).sin() * 0.3)
    x = (torch.arange(64 * 4, dtype=torch.float64).reshape(64, 4) * 0.13).cos()
    y = (torch.arange(64) * 7) % 3
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for epoch in range(4):
        model.train()
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
        sched.step()
    path = os.path.join(tempfile.mkdtemp(), "model.pt")
    torch.save(model.state_dict(), path)
    model2 = Net()
    model2.load_state_dict(torch.load(path))
    model2.eval()
    with torch.no_grad():
        out = model2(x)
        acc = (out.argmax(dim=1) == y).float().mean().item()
        final = F.cross_entropy(out, y).item()
    print(f"RUNTIME {torch.__name__} {type(torch.zeros(1)).__module__} {type(nn.Linear(1, 1)).__module__}")
    print(f"RESULT {final:.10f} {acc:.6f} {sched.get_last_lr()[0]:.6f}")


if __name__ == "__main__":
    main()
