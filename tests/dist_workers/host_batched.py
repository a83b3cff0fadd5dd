"""The batched copies of the cuda path (`triton_copy_many`: `copy_many`, `copy_addresses`, `address_of`) run on
host arrays, so DDP's and FSDP2's cuda code paths run in CPU workers: `install()` before training."""
import ctypes
import types


def copy_many(srcs, dsts):
    for s, d in zip(srcs, dsts):
        assert s.flags.c_contiguous and d.flags.c_contiguous and s.size == d.size
        d[...] = s


def copy_addresses(like, srcs, dsts, numels):
    assert len(srcs) == len(dsts) == len(numels)
    for s, d, k in zip(srcs, dsts, numels):
        ctypes.memmove(d, s, k * like.itemsize)


def install():
    from flambeau._backends import multi_tensor
    fake = types.ModuleType("host_copy_many")
    fake.copy_many, fake.copy_addresses, fake.address_of = copy_many, copy_addresses, lambda a: a.ctypes.data
    multi_tensor.copy_many_for = lambda device: fake
