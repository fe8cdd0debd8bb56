"""Pattern-level swaps for fused kernels: find the op sequence a kernel fuses in a module's forward with
torch.fx and replace it by one call of the kernel.

Each module is traced on its own (its submodules stay calls, `call_module` nodes), so a forward fx cannot
trace (data-dependent control flow, unpacking a tensor's shape) only keeps that module out; its children
are traced separately. Every module is traced (torch's own layers but nn.Sequential excepted): what a
forward computes is read from its graph, never from its source text, which names `self.act`, not the GELU
behind it. An activation submodule (nn.SiLU, nn.GELU, Hugging Face's SiLUActivation, GELUTanh, any
parameter-free module whose whole forward is one F.silu or F.gelu call) counts as that function. A matched
sequence's intermediate results must have no other user. The rewritten graph becomes the module's instance `forward` (a torch.fx GraphModule sharing
the module's own submodules and parameters), so the revert deletes one attribute.

Patterns (manifest `[[replaces]]` kind "pattern", by `target`):

- silu_mul:              silu(gate) * up (F.silu or an activation module, either operand order)
- linear_bias_gelu:      gelu(Linear(x)) for an nn.Linear with a bias, or gelu(F.linear(x, w, b)) with a bias
                         (F.gelu or an activation module): the Linear runs without its bias and the kernel
                         adds the bias inside the GELU
- add_gelu:              gelu(x + bias)
- the hand-written RMSNorm `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight`
                         (pow(2) or x * x, torch.rsqrt or .rsqrt(), operands of each product in either order)
- scaled_masked_softmax: softmax(scores * scale + mask, dim=-1) (or scores / c), scale a number
"""

from __future__ import annotations

import functools
import inspect
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F  # noqa: N812

from opscope.swap.mechanisms import InstanceForward, Mechanism, Site, SwapError, site_function

_MISSING = object()


class _OwnForwardTracer(fx.Tracer):
    """Traces only the root's forward: every submodule call stays a call_module node."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return True


def _arg(node: fx.Node, i: int, name: str, default: Any = _MISSING) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _fn(node: Any, *targets: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _meth(node: Any, *names: str) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_method" and node.target in names


def _module(node: Any, root: torch.nn.Module, *classes: type) -> torch.nn.Module | None:
    if isinstance(node, fx.Node) and node.op == "call_module" and isinstance(node.target, str):
        sub = root.get_submodule(node.target)
        if type(sub) in classes:
            return sub
    return None


def _only_use(node: Any) -> bool:
    return isinstance(node, fx.Node) and len(node.users) == 1


def _is_number_constant(v: Any) -> bool:
    """An int or float argument of a graph node (not a bool, not a node): a type check, so infinities
    count, unlike opscope.units.number's finite coercion."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _binary(node: Any, fns: tuple[Any, ...], method: str) -> tuple[Any, Any] | None:
    """(a, b) of a plain binary op node (operator.mul / torch.mul / .mul()), None otherwise."""
    if (_fn(node, *fns) or _meth(node, method)) and len(node.args) == 2 and not node.kwargs:
        return node.args[0], node.args[1]
    return None


def _mul(node: Any) -> tuple[Any, Any] | None:
    return _binary(node, (operator.mul, torch.mul), "mul")


def _add(node: Any) -> tuple[Any, Any] | None:
    return _binary(node, (operator.add, torch.add), "add")


@dataclass
class Match:
    inputs: list[fx.Node]             # the site's arguments, in the pattern's `names` order
    constants: dict[str, Any]         # numbers and settings read from the graph
    nodes: list[fx.Node]              # the matched nodes, the pattern's result first
    before: fx.Node | None = None     # where new nodes go (default: the result node)
    new_attrs: list[str] = field(default_factory=list)  # get_attr targets to create, appended to inputs


class _InliningTracer(fx.Tracer):
    """Traces a module down to functions: no submodule stays a call."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return False


MAX_ACTIVATION_MODULES = 4  # an activation module and its own children, at most (a wrapper of a wrapper)


@dataclass(frozen=True)
class _Call:
    """One function applied to one tensor: a call_function node, or a call of an activation module."""

    input: Any
    function: Any
    args: tuple[Any, ...]     # the function's arguments after the input
    kwargs: dict[str, Any]


def _activation(sub: torch.nn.Module) -> _Call | None:
    """What an activation module computes, read from its traced graph: a parameter-free module whose whole
    forward is one function of its one input (nn.SiLU: F.silu(x, inplace=False); Hugging Face's GELUTanh:
    F.gelu(x, approximate='tanh')); None for anything else."""
    if next(sub.parameters(), None) is not None or sum(1 for _ in sub.modules()) > MAX_ACTIVATION_MODULES:
        return None
    try:
        graph = _InliningTracer().trace(sub)
    except Exception:  # noqa: BLE001 (fx raises many kinds; any of them: not a plain activation)
        return None
    nodes = list(graph.nodes)
    if [n.op for n in nodes] != ["placeholder", "call_function", "output"]:
        return None
    placeholder, call, output = nodes
    extra = [*call.args[1:], *call.kwargs.values()]
    if output.args != (call,) or not call.args or call.args[0] is not placeholder \
            or any(isinstance(v, fx.Node) for v in extra):
        return None
    return _Call(placeholder, call.target, tuple(call.args[1:]), dict(call.kwargs))


def _call(node: Any, root: torch.nn.Module) -> _Call | None:
    """The function a node applies to its one tensor input: its own target, or the activation module's."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_function" and node.args:
        return _Call(node.args[0], node.target, tuple(node.args[1:]), dict(node.kwargs))
    if node.op == "call_function" and "input" in node.kwargs:  # F.silu(input=x)
        return _Call(node.kwargs["input"], node.target, (), {k: v for k, v in node.kwargs.items() if k != "input"})
    if node.op == "call_module" and isinstance(node.target, str) and len(node.args) == 1 and not node.kwargs:
        inner = _activation(root.get_submodule(node.target))
        if inner is not None:
            return _Call(node.args[0], inner.function, inner.args, inner.kwargs)
    return None


def _silu_input(node: Any, root: torch.nn.Module) -> Any:
    """x of F.silu(x) (not in place), directly or through an activation module."""
    call = _call(node, root)
    if call is None or call.function is not F.silu or set(call.kwargs) - {"inplace"} or len(call.args) > 1:
        return None
    inplace = call.args[0] if call.args else call.kwargs.get("inplace", False)
    return None if inplace else call.input


def match_silu_mul(node: fx.Node, root: torch.nn.Module) -> Match | None:
    ab = _mul(node)
    if ab is None:
        return None
    for silu, up in (ab, ab[::-1]):
        gate = _silu_input(silu, root)
        if gate is not None and _only_use(silu) and isinstance(up, fx.Node):
            return Match([gate, up], {}, [node, silu])
    return None


def _gelu(node: Any, root: torch.nn.Module) -> tuple[Any, str] | None:
    """(input, approximate) of a GELU node: F.gelu, directly or through an activation module."""
    call = _call(node, root)
    if call is None or call.function is not F.gelu or call.args or set(call.kwargs) - {"approximate"}:
        return None
    approximate = call.kwargs.get("approximate", "none")
    return (call.input, approximate) if isinstance(approximate, str) else None


def match_linear_bias_gelu(node: fx.Node, root: torch.nn.Module) -> Match | None:
    gelu = _gelu(node, root)
    if gelu is None:
        return None
    linear_node, approximate = gelu
    constants = {"gelu": SimpleNamespace(approximate=approximate)}
    if not _only_use(linear_node):
        return None
    if _fn(linear_node, F.linear) and not linear_node.kwargs and len(linear_node.args) == 3 \
            and all(isinstance(a, fx.Node) for a in linear_node.args):
        return Match(list(linear_node.args), constants, [node, linear_node])  # F.linear(x, w, b), b not None
    linear = _module(linear_node, root, torch.nn.Linear)
    if linear is None or linear.bias is None or len(linear_node.args) != 1:
        return None
    return Match([linear_node.args[0]], constants, [node, linear_node],
                 new_attrs=[f"{linear_node.target}.weight", f"{linear_node.target}.bias"])


def match_add_gelu(node: fx.Node, root: torch.nn.Module) -> Match | None:
    gelu = _gelu(node, root)
    if gelu is None:
        return None
    add_node, approximate = gelu
    ab = _add(add_node)
    if ab is None or not _only_use(add_node) or not all(isinstance(v, fx.Node) for v in ab):
        return None
    return Match([ab[0], ab[1]], {"gelu": SimpleNamespace(approximate=approximate)}, [node, add_node])


def _is_last_dim(dim: Any) -> bool:
    return dim == -1 or isinstance(dim, (list, tuple)) and list(dim) == [-1]


def _squared(node: Any) -> Any:
    """x of x.pow(2) / torch.pow(x, 2) / x ** 2 / x * x."""
    if (_fn(node, torch.pow, operator.pow) or _meth(node, "pow")) and len(node.args) == 2 and node.args[1] == 2:
        return node.args[0]
    ab = _mul(node)
    if ab is not None and ab[0] is ab[1]:
        return ab[0]
    return None


def match_rms(node: fx.Node, root: torch.nn.Module) -> Match | None:
    outer = _mul(node)
    if outer is None:
        return None
    for inner, weight in (outer, outer[::-1]):
        ab = _mul(inner)
        if ab is None or not _only_use(inner) or not isinstance(weight, fx.Node):
            continue
        for x, r in (ab, ab[::-1]):
            if not ((_fn(r, torch.rsqrt) or _meth(r, "rsqrt")) and _only_use(r) and len(r.args) == 1):
                continue
            a = _add(r.args[0])
            if a is None or not _only_use(r.args[0]):
                continue
            for mean, eps in (a, a[::-1]):
                if not (_is_number_constant(eps) and (_fn(mean, torch.mean) or _meth(mean, "mean")) and _only_use(mean)):
                    continue
                if not (_is_last_dim(_arg(mean, 1, "dim", None)) and _arg(mean, 2, "keepdim", False) is True):
                    continue
                sq = mean.args[0]
                if _squared(sq) is x and _only_use(sq):
                    return Match([x, weight], {"eps": float(eps)}, [node, inner, r, r.args[0], mean, sq])
    return None


def match_scaled_masked_softmax(node: fx.Node, root: torch.nn.Module) -> Match | None:
    if _fn(node, torch.softmax, F.softmax) or _meth(node, "softmax"):
        dim = _arg(node, 1, "dim", None)
        if not _is_last_dim(dim) or node.kwargs.get("dtype") is not None or len(node.args) > 2:
            return None
    else:
        return None
    summed = node.args[0]
    a = _add(summed)
    if a is None or not isinstance(summed, fx.Node) or not _only_use(summed):
        return None
    for scaled, mask in (a, a[::-1]):
        if not isinstance(mask, fx.Node) or not _only_use(scaled):
            continue
        ab = _mul(scaled)
        if ab is not None:
            for scores, scale in (ab, ab[::-1]):
                if isinstance(scores, fx.Node) and _is_number_constant(scale):
                    return Match([scores, mask], {"scale": float(scale)}, [node, summed, scaled])
        div = _binary(scaled, (operator.truediv, torch.div), "div")
        if div is not None and isinstance(div[0], fx.Node) and _is_number_constant(div[1]) and div[1] != 0:
            return Match([div[0], mask], {"scale": 1.0 / float(div[1])}, [node, summed, scaled])
    return None


@dataclass(frozen=True)
class Pattern:
    names: tuple[str, ...]                        # the site's arguments (then the constants)
    match: Callable[[fx.Node, torch.nn.Module], Match | None]
    original: Callable[[dict[str, Any]], Any]     # the computation the pattern stands for
    hints: tuple[str, ...]                        # names in a forward's source that suggest the pattern


RMS_TARGET = "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight"
PATTERNS: dict[str, Pattern] = {
    "silu_mul": Pattern(("gate", "up"), match_silu_mul, lambda ns: F.silu(ns["gate"]) * ns["up"], ("silu", "SiLU")),
    "linear_bias_gelu": Pattern(
        ("input", "weight", "bias"), match_linear_bias_gelu,
        lambda ns: F.gelu(F.linear(ns["input"], ns["weight"], ns["bias"]), approximate=ns["gelu"].approximate),
        ("gelu", "GELU")),
    "add_gelu": Pattern(("x", "bias"), match_add_gelu,
                        lambda ns: F.gelu(ns["x"] + ns["bias"], approximate=ns["gelu"].approximate), ("gelu", "GELU")),
    RMS_TARGET: Pattern(("x", "weight"), match_rms,
                        lambda ns: ns["x"] * torch.rsqrt(ns["x"].pow(2).mean(-1, keepdim=True) + ns["eps"]) * ns["weight"],
                        ("rsqrt",)),
    "scaled_masked_softmax": Pattern(("scores", "mask"), match_scaled_masked_softmax,
                                     lambda ns: torch.softmax(ns["scores"] * ns["scale"] + ns["mask"], dim=-1),
                                     ("softmax",)),
}


def _worth_tracing(module: torch.nn.Module) -> bool:
    """Every module but containers and torch's own layers (their forward is one op, or a pattern a module
    entry covers); nn.Sequential is traced, its children become a chain of calls."""
    if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
        return False
    return isinstance(module, torch.nn.Sequential) or not type(module).__module__.startswith("torch.")


def _names_pattern(module: torch.nn.Module, hints: tuple[str, ...]) -> bool:
    """Whether a module's forward source (or an nn.Sequential's children) names the pattern: only to say
    which modules fx could not trace may have held it, never to decide what is traced."""
    if isinstance(module, torch.nn.Sequential):
        return any(h in type(c).__name__ for c in module.children() for h in hints)
    return _source_names(type(module).forward, hints)


@functools.lru_cache(maxsize=256)
def _source_names(forward: Callable[..., Any], hints: tuple[str, ...]) -> bool:
    """Whether a forward's source names one of `hints` (read once per class: a model repeats its layers)."""
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return True
    return any(h in source for h in hints)


@dataclass
class Rewritten:
    """A module whose forward graph one or more pattern entries rewrote (kept for later entries)."""

    module: torch.nn.Module
    graph: fx.Graph
    mechanism: InstanceForward


def pattern_mechanism(model: torch.nn.Module, kernel: Any, entry: Any, glue: Any, claimed: set[int],
                      rewritten: dict[int, Rewritten]) -> tuple[Mechanism | None, str]:
    """The pattern entry's mechanism over every module where it matches (None when none), and a note on
    the modules fx could not trace."""
    pattern = PATTERNS.get(entry.target)
    if pattern is None:
        raise SwapError(f"{kernel.name}: no matcher for pattern {entry.target!r} in this version of opscope "
                        f"(known: {', '.join(PATTERNS)})")
    forwards: list[tuple[torch.nn.Module, Any]] = []
    sites: list[Site] = []
    untraceable = []
    for qualname, module in model.named_modules():
        if id(module) in claimed or "forward" in module.__dict__ or not _worth_tracing(module):
            continue
        previous = rewritten.get(id(module))
        if previous is not None:
            graph = previous.graph
        else:
            try:
                graph = _OwnForwardTracer().trace(module)
            except Exception:  # noqa: BLE001 (fx raises many kinds; any of them: not traceable)
                if _names_pattern(module, pattern.hints):
                    untraceable.append(qualname or type(module).__name__)
                continue
        found = _rewrite(graph, module, pattern, kernel, entry, glue, qualname)
        if not found:
            continue
        sites.extend(found)
        gm = fx.GraphModule(module, graph, class_name=f"{type(module).__name__}Swapped")
        if previous is not None:  # an earlier entry owns this module's forward: give it the new graph
            previous.mechanism.forwards = [(m, gm.forward if m is module else f) for m, f in previous.mechanism.forwards]
        else:
            forwards.append((module, gm.forward))
    note = f"pattern {entry.target}: torch.fx could not trace {', '.join(untraceable[:5])}" if untraceable else ""
    if not sites:
        return None, note
    mech = InstanceForward("pattern", forwards, sites, f"pattern {entry.target}")
    for module, _ in forwards:
        rewritten[id(module)] = Rewritten(module, _graph_of(module, forwards), mech)
    return mech, note


def _graph_of(module: torch.nn.Module, forwards: list[tuple[torch.nn.Module, Any]]) -> fx.Graph:
    for m, fn in forwards:
        if m is module:
            graph: fx.Graph = fn.__self__.graph
            return graph
    raise AssertionError("module not rewritten")


def _rewrite(graph: fx.Graph, module: torch.nn.Module, pattern: Pattern, kernel: Any, entry: Any, glue: Any,
             qualname: str) -> list[Site]:
    sites: list[Site] = []
    for node in list(graph.nodes):
        if node.graph is not graph or node.op == "output":
            continue  # erased by an earlier match
        match = pattern.match(node, module)
        if match is None:
            continue
        constants = dict(match.constants)
        names = pattern.names

        def namespace(args: tuple[Any, ...], _c: dict[str, Any] = constants, _n: tuple[str, ...] = names) -> dict[str, Any]:
            return {**dict(zip(_n, args, strict=True)), **_c}

        site = Site(kind="pattern", target=entry.target, where=f"{qualname or '(the model)'}: {node.name}",
                    kernel=kernel.name, original=lambda *a, _ns=namespace: pattern.original(_ns(a)),
                    replacement=lambda *a, _ns=namespace: glue.run(_ns(a)),
                    accepts=lambda *a, _ns=namespace: glue.accepts(_ns(a)))
        fn = site_function(site, f"opscope_swap_{kernel.name}_{len(sites)}")
        with graph.inserting_before(match.nodes[0]):
            attrs = [graph.get_attr(t) for t in match.new_attrs]
            call = graph.call_function(fn, tuple([*match.inputs, *attrs]))
        match.nodes[0].replace_all_uses_with(call)
        for n in match.nodes:  # result first: each interior node loses its only user in turn
            graph.erase_node(n)
        sites.append(site)
    if sites:
        graph.lint()
    return sites
