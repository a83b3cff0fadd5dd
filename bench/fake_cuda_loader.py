"""CuPy's kernel loader as recorders, for code that compiles Triton kernels for sm_90 on a machine without a GPU
(tests and CPU benches of the compile path): `loader_cupy(expect)` is a stand-in for the CuPy namespace the
Triton runtime loads cubins through (`cuda.Module().load`, `get_function`, `driver.funcSetAttribute`), whose
loads check each cubin with `expect` (default: not empty); `generating_compile_fx(out)` is a `compile_fx` that
generates a graph's Triton code for cuda into `out` and runs the graph as it is."""
from __future__ import annotations


def loader_cupy(expect=bool):
    class Function:
        def __init__(self):
            self.ptr = id(self)             # one address per loaded function, as the driver's handles

    class Module:
        def load(self, cubin):
            assert expect(cubin), cubin[:16]

        def get_function(self, name):
            return Function()

    class Cupy:
        class cuda:
            pass

        class driver:
            funcSetAttribute = staticmethod(lambda *a: None)
    Cupy.cuda.Module, Cupy.cuda.driver = Module, Cupy.driver
    return Cupy


def generating_compile_fx(out: list):
    """A stand-in for `flambeau._inductor.compile_fx`: appends the (source, launches) of the Triton code the
    graph's cuda kernels get to `out`, as compile_fx builds them, and returns the graph itself to run."""
    from flambeau._inductor import codegen_triton, pad_mm, triton_schedule
    from flambeau._inductor.compile_fx import _size_names
    from flambeau._inductor.graph import GraphLowering
    from flambeau._inductor.scheduler import Kernel, schedule

    def capture(gm, example_inputs, **kwargs):
        pad_mm.pad_matrix_products(gm)
        graph = GraphLowering(gm, list(example_inputs), example_inputs[0].device, codegen_triton.DTYPES).run()
        names = _size_names(graph)
        order = triton_schedule.split_for_grid(schedule(graph), graph)
        if not names:
            order = triton_schedule.combine_pointwise(order, graph, lambda k: codegen_triton.plain_launch(k, names))
        out.append(codegen_triton.generate([k for k in order if isinstance(k, Kernel)], names))
        return gm
    return capture


class Stream:
    """CuPy's current stream as autotuning reads it: never capturing a CUDA graph."""
    ptr = 0

    def is_capturing(self):
        return False


class Event:
    """A CUDA event that records and synchronises nothing (a fake `get_elapsed_time` gives the timings)."""
    def record(self, stream=None):
        pass

    def synchronize(self):
        pass
