"""The ways to put a kernel in a model, each reversible.

Every way ends in `Site`s: one place where the kernel stands in for an original computation, with both
as callables over the same arguments (the call the model makes there), a test of whether the kernel takes
this call (the manifest's `when` conditions, the kernel's dtypes and devices; a user kernel declines a
call by returning NotImplemented), counters of swapped and fallen-back calls, and an optional recorder of
the calls (their arguments, for the traps and the op-level benchmark).

Mechanisms (a manifest `[[replaces]]` entry's `kind`, or what --op / --module / --kernel compile ask for):

- module:     each matching module instance gets an instance attribute `forward` (the site); the class's
              forward is the original. Revert deletes the attribute. Parameters, buffers, submodules and
              the state_dict are never touched.
- functional: the function's attribute in its module (torch.nn.functional.rms_norm, torch.softmax), plus
              any global of the model's own modules bound to that same function object, point to the
              site; revert puts the originals back.
- method:     a torch.Tensor method (torch.Tensor.__add__) is set on the class; revert deletes it (or
              restores the class's own).
- aten:       a TorchDispatchMode routes calls of one aten overload (or all overloads of an op) to the
              site; every other op passes through. It runs below autograd, so the original op's
              derivative is used. Revert exits the mode.
- pattern:    torch.fx traces a module's own forward (its submodules are leaves), the fused kernel's
              pattern is replaced by one call of the site, and the module's instance `forward` becomes
              the rewritten graph (opscope.swap.patterns); revert deletes the attribute.
- compile:    the model's instance `forward` is torch.compile of its own forward.

An entry whose target the model never reaches is not used: module and pattern entries by looking for
matching instances, the others by one probe step in which the sites only count (the original runs).
Entries apply in manifest order; a module taken by one entry is left alone by later ones.
"""

from __future__ import annotations

import ast
import builtins
import fnmatch
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch

from opscope.swap.mechanisms import (
    AtenRoute,
    AttributePatch,
    InstanceForward,
    Mechanism,
    Site,
    Swap,
    SwapError,
    site_function,
    version_of,
)

_SAFE_BUILTINS = {n: getattr(builtins, n) for n in (
    "len", "tuple", "list", "isinstance", "getattr", "hasattr", "min", "max", "abs", "int", "float", "bool",
    "str", "any", "all", "range")}
# torch's C++ imports Python modules through the calling frame's builtins (under a dispatch mode, say):
# without __import__ there, F.linear in a call mapping raised KeyError and the call fell back.
_EVAL_BUILTINS = {**_SAFE_BUILTINS, "__import__": builtins.__import__}


class Expr:
    """A manifest expression (`module.weight`, `dim in (-1, input.dim() - 1)`), compiled once."""

    def __init__(self, text: str, where: str) -> None:
        self.text = text
        try:
            self.code = compile(text, where, "eval")
        except SyntaxError as exc:
            raise SwapError(f"{where}: cannot parse {text!r}: {exc.msg}") from exc
        # the names the expression reads from the call (not builtins, not torch)
        self.names = [n.id for n in ast.walk(ast.parse(text, mode="eval"))
                      if isinstance(n, ast.Name) and n.id not in _SAFE_BUILTINS and n.id != "torch"]

    def __call__(self, ns: dict[str, Any]) -> Any:
        return eval(self.code, {"__builtins__": _EVAL_BUILTINS, "torch": torch}, ns)  # noqa: S307 (bundled manifests)


# --- call binding: (args, kwargs) of the intercepted call -> names ---------------------------------------


def _signature_from_doc(fn: Any) -> inspect.Signature | None:
    """A builtin's signature from the first line of its docstring ("softmax(input, dim, *, dtype=None)")."""
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    if not doc:
        return None
    try:
        tree = ast.parse(f"def _{doc[0].split('->')[0].strip()[len(doc[0].split('(')[0]):]}: pass")
    except SyntaxError:
        return None
    parsed = tree.body[0]
    if not isinstance(parsed, ast.FunctionDef):
        return None
    a = parsed.args
    params = []
    defaults = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults)
    for arg, default in zip(a.args, defaults, strict=True):
        params.append(inspect.Parameter(arg.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        default=inspect.Parameter.empty if default is None else ast.literal_eval(default)))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append(inspect.Parameter(arg.arg, inspect.Parameter.KEYWORD_ONLY,
                                        default=inspect.Parameter.empty if default is None else ast.literal_eval(default)))
    return inspect.Signature(params)


def signature_of(fn: Any) -> inspect.Signature:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        sig = _signature_from_doc(fn)
        if sig is None:
            raise SwapError(f"cannot read the signature of {getattr(fn, '__name__', fn)!r}") from None
        return sig


def schema_signature(op: Any) -> inspect.Signature:
    """An aten overload's arguments as an inspect.Signature (names, kwarg-only, defaults)."""
    params = []
    for arg in op._schema.arguments:
        kind = inspect.Parameter.KEYWORD_ONLY if arg.kwarg_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        default = arg.default_value if arg.has_default_value() else inspect.Parameter.empty
        params.append(inspect.Parameter(arg.name, kind, default=default))
    return inspect.Signature(params)


class Binder:
    """Names the arguments of an intercepted call as the manifest's expressions use them. Names the
    expressions use that the signature lacks are the signature's unused parameters, in order (a
    manifest's `hidden_states` is the `x` of `forward(self, x)`)."""

    def __init__(self, sig: inspect.Signature, used_names: list[str], skip_first: bool = False) -> None:
        self.sig = sig
        params = list(sig.parameters)
        self.params = params[1:] if skip_first else params
        self.skip_first = skip_first
        missing = [n for n in dict.fromkeys(used_names) if n not in sig.parameters and n not in ("module", "torch")]
        spare = [p for p in self.params if p not in used_names]
        self.alias = dict(zip(missing, spare, strict=False))

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any], first: Any = None) -> dict[str, Any]:
        bound = self.sig.bind(first, *args, **kwargs) if self.skip_first else self.sig.bind(*args, **kwargs)
        bound.apply_defaults()
        ns = dict(bound.arguments)
        for alias, real in self.alias.items():
            ns[alias] = ns.get(real)
        return ns


# --- sites and the recorder ----------------------------------------------------------------------------


# --- mechanisms --------------------------------------------------------------------------------------


# --- bundled kernels ---------------------------------------------------------------------------------


class BundledKernel:
    """A reference kernel: its manifest and its op, torch.ops.opscope.<name>."""

    def __init__(self, manifest: Any) -> None:
        import reference_kernels

        self.manifest = manifest
        self.name = manifest.name
        self.op = reference_kernels.load(manifest.name)  # registers the kernel's ops on first use
        self.dtypes = {getattr(torch, d) for d in manifest.dtypes}
        self.cuda = any(b in manifest.backends for b in ("triton", "cuda"))

    def supports(self, tensors: list[torch.Tensor]) -> bool:
        """The kernel runs on the first of `tensors` (its dtype and device)."""
        if not tensors:
            return False
        t = tensors[0]
        return t.dtype in self.dtypes and (t.device.type == "cpu" or t.device.type == "cuda" and self.cuda)


class Glue:
    """One manifest entry's `call` and `when` over a binder's names."""

    def __init__(self, kernel: BundledKernel, entry: Any) -> None:
        where = f"{kernel.name} manifest, [[replaces]] {entry.target}"
        self.kernel = kernel
        self.entry = entry
        self.call = {arg: Expr(text, where) for arg, text in entry.call.items()}
        self.when = [Expr(text, where) for text in entry.when]

    @property
    def names(self) -> list[str]:
        return [n for e in [*self.call.values(), *self.when] for n in e.names]

    def static_when(self, module: torch.nn.Module) -> bool | None:
        """The `when` conditions that read only `module`, on this module (None: none such)."""
        static = [e for e in self.when if set(e.names) <= {"module", "torch"}]
        if not static:
            return None
        try:
            return all(e({"module": module}) for e in static)
        except Exception:
            return False

    def kwargs(self, ns: dict[str, Any]) -> dict[str, Any]:
        return {arg: e(ns) for arg, e in self.call.items()}

    def inputs(self, ns: dict[str, Any]) -> list[torch.Tensor]:
        """The tensors of the intercepted call that the call mapping reads, in the mapping's order."""
        names = dict.fromkeys(n for e in self.call.values() for n in e.names)
        return [v for n in names if isinstance(v := ns.get(n), torch.Tensor)]

    def accepts(self, ns: dict[str, Any]) -> bool:
        """The `when` conditions, and the kernel's dtypes and devices on the call's own tensors. The call
        mapping is never evaluated here: it may compute (bias_gelu's x is F.linear(input, weight)), and
        acceptance that computes runs that work twice."""
        return all(e(ns) for e in self.when) and self.kernel.supports(self.inputs(ns))

    def run(self, ns: dict[str, Any]) -> Any:
        return self.kernel.op(**self.kwargs(ns))


def resolve(dotted: str) -> tuple[Any, str, Any]:
    """'torch.nn.functional.rms_norm' -> (owner module or class, attribute name, value)."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:-1]:
            owner = getattr(owner, p, None)
        if owner is not None and hasattr(owner, parts[-1]):
            return owner, parts[-1], getattr(owner, parts[-1])
        break
    raise SwapError(f"cannot find {dotted}")


def aten_target(name: str) -> Any:
    """'aten::add.Tensor' -> the overload; 'aten::add' -> the op (every overload)."""
    op, _, overload = name.removeprefix("aten::").partition(".")
    packet = getattr(torch.ops.aten, op, None)
    if packet is None:
        raise SwapError(f"no aten op {name}")
    if not overload:
        return packet
    target = getattr(packet, overload, None)
    if target is None:
        raise SwapError(f"aten::{op} has no overload {overload!r} (it has: {', '.join(packet.overloads())})")
    return target


def _model_globals(model: torch.nn.Module) -> list[dict[str, Any]]:
    """The globals of the Python modules that define the model's classes (outside torch)."""
    import sys

    seen: dict[str, dict[str, Any]] = {}
    for m in model.modules():
        name = type(m).__module__
        if name.startswith("torch.") or name in seen:
            continue
        mod = sys.modules.get(name)
        if mod is not None:
            seen[name] = vars(mod)
    return list(seen.values())


def functional_patches(owner: Any, name: str, original: Any, model: torch.nn.Module,
                       new: Callable[..., Any]) -> list[tuple[Any, str, Any]]:
    patches: list[tuple[Any, str, Any]] = [(owner, name, new)]
    for g in _model_globals(model):
        for key, value in g.items():
            if value is original:
                patches.append((g, key, new))
    return patches


def _class_matches(module: torch.nn.Module, target: str) -> bool:
    cls = type(module)
    if "*" in target or "?" in target:
        return fnmatch.fnmatchcase(cls.__name__, target)
    owner, name, value = resolve(target)
    # the class itself, or a subclass that keeps its forward (its math is the class's)
    return isinstance(value, type) and isinstance(module, value) and cls.forward is cast(Any, value).forward


class Builder:
    """Builds one Swap for a model; `probe_step` runs one step of the model (for entries whose sites are
    found by running it)."""

    def __init__(self, model: torch.nn.Module, probe_step: Callable[[], Any]) -> None:
        self.model = model
        self.probe_step = probe_step
        self.claimed: set[int] = set()  # modules whose forward a module entry took
        self.rewritten: dict[int, Any] = {}  # modules whose forward graph pattern entries rewrote

    def bundled(self, label: str, kernels: list[Any]) -> Swap:
        swap = Swap(label=label, tolerance_kernels=[k.manifest for k in kernels])
        for kernel in kernels:
            for entry in kernel.manifest.replaces:
                mech = self._entry(kernel, entry, swap)
                if mech is not None:
                    swap.mechanisms.append(mech)
        self._prune(swap)
        if not swap.sites:
            targets = "; ".join(f"{e.kind} {e.target}" for k in kernels for e in k.manifest.replaces)
            notes = f"; {'; '.join(swap.notes)}" if swap.notes else ""
            raise SwapError(f"nothing in the model matches {label} (looked for: {targets}){notes}")
        return swap

    def _entry(self, kernel: BundledKernel, entry: Any, swap: Swap) -> Mechanism | None:
        glue = Glue(kernel, entry)
        if entry.kind == "module":
            return self._modules(kernel, entry, glue)
        if entry.kind == "pattern":
            from opscope.swap.patterns import pattern_mechanism

            mech, note = pattern_mechanism(self.model, kernel, entry, glue, self.claimed, self.rewritten)
            if note:
                swap.notes.append(note)
            return mech
        if entry.kind in ("functional", "method"):
            owner, name, original = resolve(entry.target)
            if entry.kind == "functional":
                binder = Binder(signature_of(original), glue.names)
            else:
                binder = Binder(schema_signature(_method_overload(name)), glue.names)
            site = Site(kind=entry.kind, target=entry.target, where=entry.target, kernel=kernel.name,
                        original=original, replacement=lambda *a, **k: glue.run(binder(a, k)),
                        accepts=lambda *a, **k: glue.accepts(binder(a, k)))
            fn = site_function(site, f"opscope_swap_{name.strip('_')}")
            patches = functional_patches(owner, name, original, self.model, fn) if entry.kind == "functional" \
                else [(owner, name, fn)]
            patch = AttributePatch(entry.kind, patches, [site], f"{entry.kind} {entry.target}")
            return self._if_reached(patch, swap)
        if entry.kind == "aten":
            func = aten_target(entry.target)
            overload = func if hasattr(func, "_schema") else getattr(func, func.overloads()[0])
            binder = Binder(schema_signature(overload), glue.names)
            site = Site(kind="aten", target=entry.target, where=entry.target, kernel=kernel.name,
                        original=func, replacement=lambda *a, **k: glue.run(binder(a, k)),
                        accepts=lambda *a, **k: glue.accepts(binder(a, k)), in_autograd=False)
            return self._if_reached(AtenRoute({func: site}, f"aten {entry.target}"), swap)
        raise SwapError(f"{kernel.name}: unknown [[replaces]] kind {entry.kind!r}")

    def _modules(self, kernel: BundledKernel, entry: Any, glue: Glue) -> Mechanism | None:
        forwards: list[tuple[torch.nn.Module, Site]] = []
        sites: list[Site] = []
        for qualname, module in self.model.named_modules():
            if id(module) in self.claimed or id(module) in self.rewritten or "forward" in module.__dict__ \
                    or not _class_matches(module, entry.target):
                continue
            if glue.static_when(module) is False:
                continue
            binder = Binder(signature_of(type(module).forward), glue.names, skip_first=True)
            original = type(module).forward.__get__(module)

            def run(*a: Any, _m: torch.nn.Module = module, _b: Binder = binder, **k: Any) -> Any:
                return glue.run({**_b(a, k, _m), "module": _m})

            def accepts(*a: Any, _m: torch.nn.Module = module, _b: Binder = binder, **k: Any) -> bool:
                return glue.accepts({**_b(a, k, _m), "module": _m})

            site = Site(kind="module", target=entry.target, where=qualname or "(the model)", kernel=kernel.name,
                        original=original, replacement=run, accepts=accepts)
            site.params = [p for p in module.parameters() if p.requires_grad]
            forwards.append((module, site))
            sites.append(site)
            self.claimed.add(id(module))
        if not sites:
            return None
        return InstanceForward("module", forwards, sites, f"module {entry.target}")

    def _prune(self, swap: Swap) -> None:
        """Drops the function-level mechanisms that a later entry made unreachable (a pattern now calls
        the kernel where torch.softmax was called): one step with everything applied."""
        if not any(m.kind in ("functional", "method", "aten") for m in swap.mechanisms):
            return
        swap.reset_counts()
        with swap.applied(), torch.random.fork_rng():
            self.probe_step()
        swap.mechanisms = [m for m in swap.mechanisms if m.kind in ("module", "pattern")
                           or any(s.swapped + s.fallback for s in m.sites)]
        swap.reset_counts()

    def _if_reached(self, mech: Mechanism, swap: Swap) -> Mechanism | None:
        """Keeps `mech` if one probe step, with the swap's mechanisms so far applied (their kernels run),
        reaches its sites (which only count, running the original)."""
        trial = Swap(label=swap.label, mechanisms=[*swap.mechanisms, mech])
        new = Swap(label=swap.label, mechanisms=[mech])
        with new.probing(), trial.applied(), torch.random.fork_rng():
            self.probe_step()
        reached = sum(s.swapped + s.fallback for s in mech.sites)
        trial.reset_counts()
        return mech if reached else None

    def user(self, label: str, fn: Callable[..., Any], op: str | None, module: str | None) -> Swap:
        swap = Swap(label=label)
        if module is not None:
            forwards: list[tuple[torch.nn.Module, Site]] = []
            sites: list[Site] = []
            for qualname, m in self.model.named_modules():
                if not _user_module_matches(qualname, m, module):
                    continue
                site = Site(kind="module", target=module, where=qualname or "(the model)", kernel=label,
                            original=type(m).forward.__get__(m),
                            replacement=lambda *a, _m=m, **k: fn(_m, *a, **k))
                site.params = [p for p in m.parameters() if p.requires_grad]
                forwards.append((m, site))
                sites.append(site)
            if not sites:
                names = sorted({type(m).__name__ for m in self.model.modules()})
                raise SwapError(f"--module {module}: no module of the model matches by class or qualified name "
                                f"(its classes: {', '.join(names[:20])})")
            swap.mechanisms.append(InstanceForward("module", forwards, sites, f"module {module}"))
            return swap
        assert op is not None
        if op.startswith("aten::"):
            func = aten_target(op)
            site = Site(kind="aten", target=op, where=op, kernel=label, original=func, replacement=fn, in_autograd=False)
            mech: Mechanism = AtenRoute({func: site}, f"aten {op}")
        else:
            owner, name, original = resolve(op)
            site = Site(kind="functional", target=op, where=op, kernel=label, original=original, replacement=fn)
            mech = AttributePatch("functional", functional_patches(owner, name, original, self.model,
                                                                  site_function(site, f"opscope_swap_{name}")),
                                  [site], f"functional {op}")
        reached = self._if_reached(mech, swap)
        if reached is None:
            raise SwapError(f"--op {op}: the model never calls it (one step was run to look)")
        swap.mechanisms.append(reached)
        return swap

    def compiled(self) -> Swap:
        model = self.model
        original = type(model).forward.__get__(model)
        fn = torch.compile(original)
        site = Site(kind="compile", target="torch.compile", where="(the model)", kernel="compile",
                    original=original, replacement=fn)
        return Swap(label="compile", mechanisms=[InstanceForward("compile", [(model, fn)], [site],
                                                                 "torch.compile of the model")])


def _user_module_matches(qualname: str, module: torch.nn.Module, pattern: str) -> bool:
    """--module: the class name, the class's full dotted name, or the module's qualified name in the
    model (globs allowed; the model itself has no qualified name)."""
    cls = type(module)
    return (fnmatch.fnmatchcase(cls.__name__, pattern) or fnmatch.fnmatchcase(f"{cls.__module__}.{cls.__qualname__}", pattern)
            or bool(qualname) and fnmatch.fnmatchcase(qualname, pattern))


def _method_overload(name: str) -> Any:
    """The aten overload behind a Tensor method (for its argument names): __add__ -> aten::add.Tensor."""
    packet = getattr(torch.ops.aten, name.strip("_"))
    return getattr(packet, "Tensor" if "Tensor" in packet.overloads() else packet.overloads()[0])


# --- proving the revert --------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """What a swap must leave as it found it: the model's modules (names, objects, classes), forward
    functions (instance-level and the class's), state_dict entries (objects, storage, version counter,
    shape, dtype), the torch namespaces a swap patches and the dispatch-mode stack."""

    modules: list[tuple[str, int, type]]
    forwards: list[tuple[str, Any, Any]]
    state: dict[str, tuple[int, int, int | None, tuple[int, ...], torch.dtype]]
    namespaces: dict[str, dict[str, Any]]
    dispatch_modes: int


def _namespaces(model: torch.nn.Module) -> dict[str, Mapping[str, Any]]:
    import torch.nn.functional as F  # noqa: N812

    spaces: dict[str, Mapping[str, Any]] = {"torch": vars(torch), "torch.nn.functional": vars(F),
                                            "torch.Tensor": vars(torch.Tensor)}
    for g in _model_globals(model):
        spaces[str(g.get("__name__"))] = g
    return spaces


def snapshot(model: torch.nn.Module) -> Snapshot:
    return Snapshot(
        modules=[(n, id(m), type(m)) for n, m in model.named_modules()],
        forwards=[(n, m.__dict__.get("forward"), type(m).forward) for n, m in model.named_modules()],
        state={k: (id(v), v.data_ptr(), version_of(v), tuple(v.shape), v.dtype)
               for k, v in model.state_dict(keep_vars=True).items()},
        namespaces={name: dict(space) for name, space in _namespaces(model).items()},
        dispatch_modes=torch._C._len_torch_dispatch_stack(),
    )


def _same(now: Any, before: Any) -> bool:
    """The same object, or a wrapper torch put around it in the meantime (importing torch._dynamo wraps
    torch.manual_seed, functools.wraps style)."""
    for _ in range(8):
        if now is before:
            return True
        now = getattr(now, "__wrapped__", None) if callable(now) else None
        if now is None:
            return False
    return False


def differences(before: Snapshot, after: Snapshot) -> list[str]:
    """What changed between two snapshots (empty: the swap reverted cleanly)."""
    out = []
    if before.modules != after.modules:
        out.append("the model's modules changed")
    for (name, inst_a, cls_a), (_, inst_b, cls_b) in zip(before.forwards, after.forwards, strict=False):
        if inst_a is not inst_b or cls_a is not cls_b:
            out.append(f"forward of {name or '(the model)'} changed")
    if before.state.keys() != after.state.keys():
        out.append("state_dict keys changed")
    for k, v in before.state.items():
        if k in after.state and after.state[k] != v:
            out.append(f"state_dict[{k!r}] changed (object, storage, version, shape or dtype)")
    for space, names in before.namespaces.items():
        now = after.namespaces.get(space, {})
        changed = [k for k, v in names.items() if k in now and not _same(now[k], v) and not k.startswith("__")]
        if space == "torch.Tensor":
            changed += [k for k in now if k not in names]
        if changed:
            out.append(f"{space}: {', '.join(sorted(changed)[:5])} changed")
    if before.dispatch_modes != after.dispatch_modes:
        out.append("a dispatch mode was left active")
    return out
