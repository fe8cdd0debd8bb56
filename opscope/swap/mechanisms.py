"""How a swap changes a model, and undoes it: the sites a kernel takes over (each recording the calls it
sees), the mechanisms that patch them in (a module's forward, an attribute, an aten route) and the Swap
that holds them. opscope.swap.apply decides what goes where; opscope.swap.patterns adds graph rewrites."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opscope.errors import OpscopeError

MAX_RECORDED = 6  # distinct call signatures kept per site (each with a copy of its arguments)


class SwapError(OpscopeError):
    """The swap cannot be built: nothing in the model matches, a kernel cannot be loaded, ..."""


@dataclass
class RecordedCall:
    """The first call of one signature at a site: a detached copy of its arguments, how many calls in the
    recorded step had this signature, and whether the kernel ran them."""

    site: Site
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    signature: str
    calls: int = 0
    used: bool = False


def describe_value(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        dtype = str(v.dtype).removeprefix("torch.")
        layout = "" if v.is_contiguous() else f" strides {list(v.stride())}"
        return f"{list(v.shape)} {dtype}{layout}{'' if v.device.type == 'cpu' else ' ' + str(v.device)}"
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(describe_value(x) for x in v) + ")"
    return repr(v)[:40]


def _copy(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        with torch.inference_mode(False), torch.no_grad():
            return v.detach().clone()
    if isinstance(v, (list, tuple)):
        return type(v)(_copy(x) for x in v)
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    return v


def version_of(t: torch.Tensor) -> int | None:
    """A tensor's version counter (bumped by every in-place write); None for an inference tensor, which
    has none (a kernel that creates parameters under inference_mode makes them)."""
    return None if t.is_inference() else t._version


class KernelExit(Exception):
    """The kernel raised SystemExit (called sys.exit()): its failure, like any exception it raises, not
    the end of opscope's work."""


def _exit_is_an_error(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SystemExit as exc:
            raise KernelExit(f"the kernel called sys.exit({exc.code!r})") from None

    return call


class Recorder:
    """Collects the calls each site receives while it is attached (one signature kept once)."""

    def __init__(self) -> None:
        self.calls: dict[tuple[int, str], RecordedCall] = {}
        self._lock = threading.Lock()

    def record(self, site: Site, args: tuple[Any, ...], kwargs: dict[str, Any]) -> RecordedCall | None:
        sig = ", ".join([describe_value(a) for a in args] + [f"{k}={describe_value(v)}" for k, v in kwargs.items()])
        key = (id(site), sig)
        with self._lock:
            entry = self.calls.get(key)
            if entry is None:
                if sum(1 for k in self.calls if k[0] == id(site)) >= MAX_RECORDED:
                    return None
                entry = self.calls[key] = RecordedCall(site, _copy(args), _copy(kwargs), sig)
            entry.calls += 1
        return entry


class Site:
    """One place a kernel stands in for the original computation (see the module docstring)."""

    def __init__(self, *, kind: str, target: str, where: str, kernel: str, original: Callable[..., Any],
                 replacement: Callable[..., Any], accepts: Callable[..., bool] | None = None,
                 in_autograd: bool = True) -> None:
        self.kind, self.target, self.where, self.kernel = kind, target, where, kernel
        self.original = original
        self.replacement = _exit_is_an_error(replacement)
        self._accepts = accepts
        # False for aten routes: the kernel runs below autograd, whose derivative is the original op's.
        self.in_autograd = in_autograd
        self.params: list[torch.Tensor] = []  # a module site's own parameters (the traps differentiate them too)
        self.swapped = 0
        self.fallback = 0
        self.recorder: Recorder | None = None
        self.probe = False
        self._lock = threading.Lock()

    def accepts(self, *args: Any, **kwargs: Any) -> bool:
        if self._accepts is None:
            return True
        try:
            return bool(self._accepts(*args, **kwargs))
        except Exception:  # a condition that cannot be evaluated on this call: not swapped
            return False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        entry = self.recorder.record(self, args, kwargs) if self.recorder is not None else None
        if self.accepts(*args, **kwargs):
            if self.probe:
                self._count(True)
                return self.original(*args, **kwargs)
            out = self.replacement(*args, **kwargs)
            if out is not NotImplemented:
                self._count(True)
                if entry is not None:
                    entry.used = True
                return out
        self._count(False)
        return self.original(*args, **kwargs)

    def _count(self, swapped: bool) -> None:
        with self._lock:
            if swapped:
                self.swapped += 1
            else:
                self.fallback += 1

    def reset(self) -> None:
        self.swapped = self.fallback = 0

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "where": self.where, "kernel": self.kernel}


def site_function(site: Site, name: str) -> Callable[..., Any]:
    """A plain function calling `site` (torch.fx and class attributes need a function, not an object)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return site(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = "opscope_swap"
    return call


class Mechanism:
    kind = ""

    def __init__(self, sites: list[Site], description: str) -> None:
        self.sites = sites
        self.description = description

    def activate(self) -> None: ...
    def deactivate(self) -> None: ...


class InstanceForward(Mechanism):
    """module, pattern and compile: instance attributes `forward`, deleted on revert."""

    def __init__(self, kind: str, forwards: Sequence[tuple[torch.nn.Module, Callable[..., Any]]], sites: list[Site],
                 description: str) -> None:
        super().__init__(sites, description)
        self.kind = kind
        self.forwards = forwards

    def activate(self) -> None:
        done = []
        try:
            for module, fn in self.forwards:
                if "forward" in module.__dict__:
                    raise SwapError(f"{type(module).__name__} already has an instance-level forward; not swapping it")
                module.__dict__["forward"] = fn
                done.append(module)
        except BaseException:
            for module in done:
                module.__dict__.pop("forward", None)
            raise

    def deactivate(self) -> None:
        for module, fn in self.forwards:
            if module.__dict__.get("forward") is fn:
                del module.__dict__["forward"]


class AttributePatch(Mechanism):
    """functional and method: attributes of modules, module globals or torch.Tensor, restored on revert."""

    def __init__(self, kind: str, patches: list[tuple[Any, str, Any]], sites: list[Site], description: str) -> None:
        super().__init__(sites, description)
        self.kind = kind
        self.patches = patches  # (owner: module, dict or class, name, replacement)
        self._saved: list[tuple[Any, str, bool, Any]] = []

    def activate(self) -> None:
        for owner, name, new in self.patches:
            if isinstance(owner, dict):
                self._saved.append((owner, name, name in owner, owner.get(name)))
                owner[name] = new
            else:
                own = name in vars(owner)
                self._saved.append((owner, name, own, vars(owner).get(name)))
                setattr(owner, name, new)

    def deactivate(self) -> None:
        while self._saved:
            owner, name, had, old = self._saved.pop()
            if isinstance(owner, dict):
                if had:
                    owner[name] = old
                else:
                    owner.pop(name, None)
            elif had:
                setattr(owner, name, old)
            else:
                delattr(owner, name)


class _RouteMode(TorchDispatchMode):  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
    def __init__(self, routes: dict[Any, Site]) -> None:
        super().__init__()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
        self.routes = routes

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        site = self.routes.get(func) or self.routes.get(func.overloadpacket)
        if site is None:
            return func(*args, **kwargs)
        return site(*args, **kwargs)


class AtenRoute(Mechanism):
    kind = "aten"

    def __init__(self, routes: dict[Any, Site], description: str) -> None:
        super().__init__(list(routes.values()), description)
        self.routes = routes
        self._mode: _RouteMode | None = None

    def activate(self) -> None:
        self._mode = _RouteMode(self.routes)
        self._mode.__enter__()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch

    def deactivate(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
            self._mode = None


@dataclass
class Swap:
    """Mechanisms applied together (one kernel's entries, several kernels, a user kernel or compile)."""

    label: str
    mechanisms: list[Mechanism] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tolerance_kernels: list[Any] = field(default_factory=list)  # manifests whose tolerances apply

    @property
    def sites(self) -> list[Site]:
        return [s for m in self.mechanisms for s in m.sites]

    @contextmanager
    def applied(self) -> Iterator[None]:
        done: list[Mechanism] = []
        try:
            for m in self.mechanisms:
                m.activate()
                done.append(m)
            yield
        finally:
            for m in reversed(done):
                m.deactivate()

    @contextmanager
    def probing(self) -> Iterator[None]:
        """Sites count the calls they would take but run the original."""
        for s in self.sites:
            s.probe = True
        try:
            yield
        finally:
            for s in self.sites:
                s.probe = False

    @contextmanager
    def recording(self) -> Iterator[Recorder]:
        recorder = Recorder()
        for s in self.sites:
            s.recorder = recorder
        try:
            yield recorder
        finally:
            for s in self.sites:
                s.recorder = None

    def reset_counts(self) -> None:
        for s in self.sites:
            s.reset()

    def counts(self) -> tuple[int, int]:
        return sum(s.swapped for s in self.sites), sum(s.fallback for s in self.sites)

    def describe(self) -> list[dict[str, Any]]:
        return [{"kind": m.kind, "description": m.description, "sites": [s.where for s in m.sites]}
                for m in self.mechanisms]
