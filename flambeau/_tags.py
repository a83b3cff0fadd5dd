"""`flambeau.Tag`: the facts an operator declares about itself (PyTorch's `torch.Tag`).

A leaf module (it imports nothing from flambeau) so that the dispatcher and the operator registry,
which import each other, can both read tags. Ops carry them in `Op.tags` (`flambeau._ops._registry`).
"""
from __future__ import annotations

import enum


class Tag(enum.Enum):
    """What an operator is, declared with it (`defop(..., tags=(Tag.core, Tag.pointwise))`).

    The first group are PyTorch's `torch.Tag` members; the rest are flambeau's. `view` and
    `inplace` are set from the schema's alias annotations and never declared by hand."""
    core = "core"                                         # in the core set the compiler's input is made of
    pointwise = "pointwise"                               # elementwise over broadcast inputs
    view_copy = "view_copy"
    inplace_view = "inplace_view"
    nondeterministic_seeded = "nondeterministic_seeded"   # draws from a generator: never CSE'd or recomputed
    data_dependent_output = "data_dependent_output"
    dynamic_output_shape = "dynamic_output_shape"
    view = "view"                                         # the schema returns an alias of an input
    inplace = "inplace"                                   # the schema mutates `self`
    nondifferentiable = "nondifferentiable"               # autograd records no grad_fn
    extern = "extern"                                     # the compiler calls the eager kernel as a library call
    recomputable = "recomputable"                         # the partitioner may recompute it in the backward
    exact_compare = "exact_compare"                       # compares operands bit for bit (eq, ne): the partitioner
                                                          # saves a backward operand, never recomputes it
    overlap_ok = "overlap_ok"                             # in-place variant may write a self with internal overlap
    no_fp_errors = "no_fp_errors"                         # the kernel moves, selects or compares values and cannot
                                                          # raise a floating-point error: eager dispatch runs it
                                                          # without silencing NumPy's (flambeau._fp_errors)
    optional_output_grads = "optional_output_grads"       # the derivative takes None for the outputs after the
                                                          # first when none of them received a gradient (autograd
                                                          # then makes no zero tensors for them)
    autocast_lower_precision = "autocast_lower_precision"  # autocast policies on cuda (and every device but cpu)
    autocast_fp32 = "autocast_fp32"
    autocast_fp32_opt = "autocast_fp32_opt"               # float32 unless the caller passes dtype=
    autocast_promote = "autocast_promote"                 # to the widest floating input
    autocast_banned = "autocast_banned"
    cpu_autocast_lower_precision = "cpu_autocast_lower_precision"  # autocast policies on cpu
    cpu_autocast_fp32 = "cpu_autocast_fp32"
    cpu_autocast_promote = "cpu_autocast_promote"

    __hash__ = object.__hash__        # members are singletons compared by identity: hash them in C
