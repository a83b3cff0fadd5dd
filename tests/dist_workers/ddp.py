"""DDP on 2 ranks: training, no_sync, unused parameters, the fp16 hook, overlap, static_graph, the bucket rebuild; results to <out>/rank<R>.npz.

Written as a PyTorch script (run on flambeau by the launcher). Each rank starts from different weights
(seeded by rank) so the broadcast at construction matters; data are the same on every rank and each
rank trains on its own slice.
"""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import step_and_mean_loss  # noqa: E402

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
res = {}
BATCH = 4


def batch(step, n):
    g = np.random.default_rng(100 + step)
    return torch.from_numpy(g.standard_normal((n, 8)).astype(np.float32)), \
        torch.from_numpy(g.standard_normal((n, 4)).astype(np.float32))


def mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


# 1. training equals one process on the concatenated batch (checked by the test against PyTorch)
def train(ddp, steps: int = 4) -> list:
    """SGD with momentum on this rank's rows of each step's batch; the losses averaged over the ranks."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = batch(step, BATCH * world)
        loss = ((ddp(x[rank * BATCH:(rank + 1) * BATCH]) - y[rank * BATCH:(rank + 1) * BATCH]) ** 2).mean()
        losses.append(step_and_mean_loss(loss, opt, dist))
    return losses


torch.manual_seed(rank)
model = mlp()
ddp = DDP(model, bucket_cap_mb=0.0005)                    # ~500 bytes: several buckets
res["n_buckets"] = np.array(len(ddp.reducer.buckets))
for k, v in model.state_dict().items():
    res[f"init/{k}"] = v.numpy().copy()
losses = train(ddp)
res["losses"] = np.array(losses)
for k, v in model.state_dict().items():
    res[f"final/{k}"] = v.numpy().copy()

# 1b. the same training with gradient_as_bucket_view: .grad are views of the buckets (no copy back),
# zeroed in place (set_to_none=False) on odd steps so backward accumulates straight into the buckets
torch.manual_seed(rank)
model = mlp()
ddp = DDP(model, bucket_cap_mb=0.0005, gradient_as_bucket_view=True)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
losses = []
for step in range(4):
    x, y = batch(step, BATCH * world)
    loss = ((ddp(x[rank * BATCH:(rank + 1) * BATCH]) - y[rank * BATCH:(rank + 1) * BATCH]) ** 2).mean()
    losses.append(step_and_mean_loss(loss, opt, dist, set_to_none=step % 2 == 0))
res["as_view/losses"] = np.array(losses)
grads_are_views = []
for b in ddp.reducer.buckets:
    for p, v in zip(b.params, b.views):
        grads_are_views.append(p.grad is v)
res["as_view/grads_are_views"] = np.array(grads_are_views)

# 1c. the same training on an engine with NCCL's two traits (a native average and `all_reduce_many`, one
# grouped operation per bucket): the reducer averages the gradients in their own memory, no copy in or back
# (here each array all-reduced with SUM by the real engine, then divided)
class InPlaceAveraging:
    native_avg = True

    def __init__(self, engine):
        self.engine, self.grouped, self.copies = engine, [], 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def all_reduce(self, buf, op_name):
        self.engine.all_reduce(buf, "SUM" if op_name == "AVG" else op_name).wait()
        if op_name == "AVG":
            buf /= world
        return self

    def all_reduce_many(self, bufs, op_name):
        self.grouped.append([b.ctypes.data for b in bufs])
        for b in bufs:
            self.all_reduce(b, op_name)
        return self

    def wait(self):
        pass

    def test(self):
        return True


group = dist.GroupMember.WORLD
real_engine_for = group.engine_for
in_place = InPlaceAveraging(real_engine_for("cpu"))
group.engine_for = lambda device_type: in_place
torch.manual_seed(rank)
model = mlp()
ddp = DDP(model, bucket_cap_mb=0.0005)
copier = sys.modules[type(ddp.reducer).__module__]._HostCopier
real_copy_many = copier.copy_many
copier.copy_many = staticmethod(lambda srcs, dsts: setattr(in_place, "copies", in_place.copies + 1) or
                                real_copy_many(srcs, dsts))
res["in_place/losses"] = np.array(train(ddp))
copier.copy_many = staticmethod(real_copy_many)
group.engine_for = real_engine_for
for k, v in model.state_dict().items():
    res[f"in_place/final/{k}"] = v.numpy().copy()
grad_addresses = sorted(p.grad.numpy().ctypes.data for p in model.parameters())
res["in_place/groups_per_step"] = np.array(len(in_place.grouped) / 4)
res["in_place/last_step_reduced_the_grads"] = np.array(sorted(a for g in in_place.grouped[-len(ddp.reducer.buckets):]
                                                              for a in g) == grad_addresses)
res["in_place/copies"] = np.array(in_place.copies)

# 2. no_sync: the first micro-batch accumulates locally, the second reduces the total
torch.manual_seed(0)
model = mlp()
ddp = DDP(model)
x, y = batch(10, 2 * BATCH * world)
mine = lambda i: slice((2 * rank + i) * BATCH, (2 * rank + i + 1) * BATCH)  # noqa: E731
with ddp.no_sync():
    ((ddp(x[mine(0)]) - y[mine(0)]) ** 2).mean().backward()
res["no_sync/local_grad"] = model[0].weight.grad.numpy().copy()
((ddp(x[mine(1)]) - y[mine(1)]) ** 2).mean().backward()
for k, p in model.named_parameters():
    res[f"no_sync/{k}"] = p.grad.numpy().copy()


# 3. find_unused_parameters: rank 0 never uses branch b, nobody uses branch c
class Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(3, 2), nn.Linear(3, 2), nn.Linear(3, 2)

    def forward(self, x):
        return self.a(x) + (self.b(x) if rank == 1 else 0)


torch.manual_seed(0)
net = Branches()
ddp = DDP(net, find_unused_parameters=True)
for it in range(2):
    net.zero_grad(set_to_none=True)
    ddp(torch.ones(2, 3) * (rank + 1)).sum().backward()
res["unused/a"] = net.a.weight.grad.numpy().copy()
res["unused/b"] = net.b.weight.grad.numpy().copy()
res["unused/c_is_none"] = np.array(net.c.weight.grad is None)

# 4. the same model without find_unused_parameters: the next forward says what is wrong
torch.manual_seed(0)
net = Branches()
ddp = DDP(net)
ddp(torch.ones(2, 3)).sum().backward()
try:
    ddp(torch.ones(2, 3))
    res["unfinished_error"] = np.array("")
except RuntimeError as e:
    res["unfinished_error"] = np.array(str(e))

# 5. the fp16 compression hook, and 6. buckets start while backward still runs
torch.manual_seed(0)
model = mlp()
ddp = DDP(model, bucket_cap_mb=0.0005)
seen_first_layer_grad = []


def recording_fp16_hook(state, bucket):
    seen_first_layer_grad.append(model[0].weight.grad is not None)
    return default_hooks.fp16_compress_hook(state, bucket)


ddp.register_comm_hook(None, recording_fp16_hook)
x, y = batch(20, BATCH * world)
ref = mlp()
ref.load_state_dict(model.state_dict())
((ref(x[rank * BATCH:(rank + 1) * BATCH]) - y[rank * BATCH:(rank + 1) * BATCH]) ** 2).mean().backward()
for k, p in ref.named_parameters():
    res[f"fp16/local/{k}"] = p.grad.numpy().copy()
((ddp(x[rank * BATCH:(rank + 1) * BATCH]) - y[rank * BATCH:(rank + 1) * BATCH]) ** 2).mean().backward()
for k, p in model.named_parameters():
    res[f"fp16/{k}"] = p.grad.numpy().copy()
res["overlap/first_layer_grad_ready"] = np.array(seen_first_layer_grad)

# 7. buffers and parameters come from rank 0 at construction
torch.manual_seed(rank)
bn = nn.BatchNorm1d(3)
bn.running_mean.fill_(float(rank + 1))
DDP(bn)
res["bn/running_mean"] = bn.running_mean.numpy().copy()
res["bn/weight"] = bn.weight.detach().numpy().copy()

# 7b. every training forward starts from rank 0's buffers (three dtypes' worth: running stats, the int64
# counter; one coalesced broadcast per dtype), then updates them with this rank's batch
bn2 = nn.Sequential(nn.BatchNorm1d(3), nn.BatchNorm1d(3))
bn_ddp = DDP(bn2)
for step in range(2):
    xs = np.random.default_rng(50 + 10 * step + rank).standard_normal((6, 3)).astype(np.float32)
    bn_ddp(torch.from_numpy(xs)).sum().backward()
for k, b in bn2.named_buffers():
    res[f"bn_sync/{k}"] = b.numpy().copy()

# 8. DistributedSampler takes num_replicas and rank from the process group
res["sampler"] = np.array(list(torch.utils.data.DistributedSampler(range(11), seed=3)))

# 9. static_graph with a parameter nobody uses, no find_unused_parameters: trains as one process would, the
# unused parameters are found by one graph walk (the first iteration), never again
class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.unused = mlp(), nn.Linear(8, 4)

    def forward(self, x):
        return self.body(x)


walks = []
reducer_module = sys.modules[type(DDP(nn.Linear(1, 1)).reducer).__module__]
real_walk = reducer_module._reachable_leaves
reducer_module._reachable_leaves = lambda outputs: walks.append(1) or real_walk(outputs)
torch.manual_seed(rank)
net = WithUnused()
ddp = DDP(net, bucket_cap_mb=0.0005, static_graph=True)
for k, v in net.state_dict().items():
    res[f"static/init/{k}"] = v.numpy().copy()
losses = train(ddp)
reducer_module._reachable_leaves = real_walk
res["static/losses"] = np.array(losses)
res["static/graph_walks"] = np.array(len(walks))
res["static/unused_grad_is_none"] = np.array(net.unused.weight.grad is None)
for k, v in net.state_dict().items():
    res[f"static/final/{k}"] = v.numpy().copy()


# 10. buckets rebuilt in gradient-arrival order after the first iteration: four layers registered 0..3,
# applied in the order FORWARD_ORDER, one layer per bucket
class Permuted(nn.Module):
    FORWARD_ORDER = (2, 0, 3, 1)

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))

    def forward(self, x):
        for i in self.FORWARD_ORDER:
            x = torch.tanh(self.layers[i](x))
        return x


def bucket_layers(ddp, net):
    """Per bucket, the layer index of each of its parameters."""
    layer_of = {id(p): i for i, layer in enumerate(net.layers) for p in layer.parameters()}
    return [[layer_of[id(p)] for p in b.params] for b in ddp.reducer.buckets]


for tag, kwargs in (("rebuild", {}), ("rebuild_static", {"static_graph": True})):
    torch.manual_seed(0)
    net = Permuted()
    ddp = DDP(net, bucket_cap_mb=(4 * 4 + 4) * 4 / 2 ** 20, **kwargs)    # one Linear(4, 4) per bucket
    res[f"{tag}/before"] = np.array(bucket_layers(ddp, net))
    for k, v in net.state_dict().items():
        res[f"{tag}/init/{k}"] = v.numpy().copy()
    for step in range(2):
        ddp(torch.ones(2, 4) * (rank + 1)).sum().backward()
        res[f"{tag}/after{step + 1}"] = np.array(bucket_layers(ddp, net))
    for k, p in net.named_parameters():
        res[f"{tag}/grad/{k}"] = p.grad.numpy().copy()

np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
dist.destroy_process_group()
