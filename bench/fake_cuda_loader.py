"""CuPy's kernel loader as recorders, for code that compiles Triton kernels for sm_90 on a machine without a GPU
(tests and CPU benches of the compile path): `loader_cupy(expect)` is a stand-in for the CuPy namespace the
Triton runtime loads cubins through (`cuda.Module().load`, `get_function`, `driver.funcSetAttribute`), whose
loads check each cubin with `expect` (default: not empty)."""
from __future__ import annotations


def loader_cupy(expect=bool):
    class Function:
        ptr = 1

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
