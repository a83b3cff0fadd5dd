"""Grad modes: no_grad, enable_grad, set_grad_enabled, inference_mode (context managers and decorators).

Grad and inference mode are per thread (`_state.tls`), as PyTorch's: a new thread starts with grad
enabled whatever its parent has. Anomaly mode is process-wide, as PyTorch's."""
from __future__ import annotations

import functools
import inspect
import warnings

from .. import _state


class _DecoratorContextManager:
    def __call__(self, fn):
        if inspect.isclass(fn):
            raise RuntimeError(f"{type(self).__name__} cannot be used to decorate a class")
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen(*a, **k):
                g = fn(*a, **k)
                try:
                    with self.clone():
                        resp = g.send(None)
                    while True:
                        try:
                            req = yield resp       # suspended: the caller's grad mode applies
                        except GeneratorExit:
                            with self.clone():
                                g.close()
                            raise
                        except BaseException as e:  # noqa: BLE001 (forwarded into the generator)
                            with self.clone():
                                resp = g.throw(e)
                        else:
                            with self.clone():
                                resp = g.send(req)
                except StopIteration as e:
                    return e.value
            return gen

        @functools.wraps(fn)
        def wrapped(*a, **k):
            with self.clone():
                return fn(*a, **k)
        return wrapped

    def clone(self):
        return type(self)()


class no_grad(_DecoratorContextManager):
    def __init__(self, orig_func=None):
        self._orig = orig_func

    def __new__(cls, orig_func=None):
        self = super().__new__(cls)
        if orig_func is not None and callable(orig_func):
            self.__init__()
            return self(orig_func)
        return self

    def __enter__(self):
        self.prev = _state.tls.grad_enabled
        _state.tls.grad_enabled = False

    def __exit__(self, *a):
        _state.tls.grad_enabled = self.prev


class enable_grad(no_grad):
    def __enter__(self):
        self.prev = _state.tls.grad_enabled
        _state.tls.grad_enabled = True


class set_grad_enabled(_DecoratorContextManager):
    def __init__(self, mode: bool):
        self.prev = _state.tls.grad_enabled
        self.mode = bool(mode)
        _state.tls.grad_enabled = self.mode

    def __enter__(self):
        pass

    def __exit__(self, *a):
        _state.tls.grad_enabled = self.prev

    def clone(self):
        return set_grad_enabled(self.mode)

    def __call__(self, fn):
        _state.tls.grad_enabled = self.prev
        return super().__call__(fn)


class inference_mode(_DecoratorContextManager):
    def __init__(self, mode: bool = True):
        self.mode = mode

    def __new__(cls, mode=True):
        self = super().__new__(cls)
        if callable(mode) and not isinstance(mode, bool):
            self.__init__(True)
            return self(mode)
        return self

    def __enter__(self):
        self.prev = (_state.tls.grad_enabled, _state.tls.inference_mode)
        if self.mode:
            _state.tls.grad_enabled = False
            _state.tls.inference_mode = True

    def __exit__(self, *a):
        _state.tls.grad_enabled, _state.tls.inference_mode = self.prev

    def clone(self):
        return inference_mode(self.mode)


def is_grad_enabled() -> bool:
    return _state.tls.grad_enabled


def is_inference_mode_enabled() -> bool:
    return _state.tls.inference_mode


class set_detect_anomaly:
    def __init__(self, mode: bool, check_nan: bool = True):
        self.prev = (_state.anomaly, _state.anomaly_check_nan)
        _state.anomaly, _state.anomaly_check_nan = mode, check_nan

    def __enter__(self):
        pass

    def __exit__(self, *a):
        _state.anomaly, _state.anomaly_check_nan = self.prev


class detect_anomaly(_DecoratorContextManager):
    def __init__(self, check_nan: bool = True):
        self.check_nan = check_nan
        warnings.warn("Anomaly Detection has been enabled. This mode will increase the runtime and should "
                      "only be enabled for debugging.", UserWarning, stacklevel=2)

    def __enter__(self):
        self.prev = (_state.anomaly, _state.anomaly_check_nan)
        _state.anomaly, _state.anomaly_check_nan = True, self.check_nan

    def __exit__(self, *a):
        _state.anomaly, _state.anomaly_check_nan = self.prev

    def clone(self):
        c = object.__new__(detect_anomaly)
        c.check_nan = self.check_nan
        return c


def is_anomaly_enabled() -> bool:
    return _state.anomaly


def is_anomaly_check_nan_enabled() -> bool:
    return _state.anomaly_check_nan
