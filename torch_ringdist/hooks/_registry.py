"""The table of ringdist DDP hooks: name -> hook function, state class, state factory.

Imports no hook module, so every hook module can use it: each one adds its own
hooks when imported (``torch_ringdist.hooks`` imports them all), and
``accumulate`` makes its inner hook's state here.
"""
from __future__ import annotations

import difflib
import inspect
from typing import Callable, NamedTuple

from torch_ringdist.hooks._base import HookState


class Hook(NamedTuple):
    hook: Callable          # hook(state, bucket) -> Future[Tensor], what DDP calls
    state_type: type        # the state class register(state=...) accepts
    factory: Callable[..., HookState]  # factory(**options) -> a new state


_HOOKS: dict[str, Hook] = {}


def add_hook(name: str, hook: Callable, state_type: type,
             factory: Callable[..., HookState] | None = None) -> None:
    """Make hook ``name`` known (factory: the state class itself if None)."""
    _HOOKS[name] = Hook(hook, state_type, factory if factory is not None else state_type)


def available() -> list[str]:
    """Names accepted by :func:`register`."""
    return sorted(_HOOKS)


def lookup(name: str) -> Hook:
    if name not in _HOOKS:
        close = difflib.get_close_matches(str(name), _HOOKS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise ValueError(f"torch_ringdist.hooks: unknown hook {name!r}{hint} Available: "
                         f"{', '.join(available())}")
    return _HOOKS[name]


def _option_levels(name: str, options: dict) -> tuple[list, dict]:
    """The options hook ``name`` takes, as [(hook, its option names)] from ``name`` down
    through the hooks it wraps (``accumulate``, ``delayed``: their other options go to the
    hook they name), and the options none of them takes."""
    params = inspect.signature(lookup(name).factory).parameters
    own = [n for n, p in params.items()
           if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    rest = {k: v for k, v in options.items() if k not in own}
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return [(name, own)], rest
    inner = options.get("hook", params["hook"].default if "hook" in params else None)
    if not isinstance(inner, str) or inner not in _HOOKS:
        return [(name, own)], {}  # a state or an unknown name: the wrapper's own checks speak
    levels, unknown = _option_levels(inner, rest)
    return [(name, own)] + levels, unknown


def check_options(name: str, options: dict, extra: tuple = ()) -> None:
    """Raises a ValueError that names hook ``name``, lists its options and suggests the
    closest when ``options`` holds one it does not take (``extra``: other keywords the
    caller accepts, e.g. :func:`register`'s ``optimizer``)."""
    levels, unknown = _option_levels(name, options)
    unknown = [k for k in unknown if k not in extra]
    if not unknown:
        return
    valid = [o for _, names in levels for o in names] + list(extra)
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, valid, n=1)
        if close:
            hints.append(f"{close[0]!r}" + (f" for {key!r}" if len(unknown) > 1 else ""))
    hint = f"; did you mean {', '.join(hints)}?" if hints else "."
    takes = []
    for hook, names in levels:
        whose = "Its options" if hook == name else f"those of the wrapped hook {hook!r}"
        takes.append(f"{whose}: {', '.join(names) if names else '(none)'}")
    if extra:
        takes.append(f"register also takes {', '.join(extra)}")
    what = "option" if len(unknown) == 1 else "options"
    raise ValueError(f"torch_ringdist.hooks: bad options for hook {name!r}: no {what} "
                     f"{', '.join(repr(k) for k in unknown)}{hint} {'; '.join(takes)}")


def make_state(name: str, **options) -> HookState:
    """A new state for hook ``name`` (options as in :func:`register`)."""
    factory = lookup(name).factory
    check_options(name, options)
    try:
        return factory(**options)
    except TypeError as exc:
        raise ValueError(f"torch_ringdist.hooks: bad options for hook {name!r}: {exc}") from exc


def inner_state(wrapper: str, hook, refused, process_group, options: dict) -> HookState:
    """The state of the hook a wrapping hook (``accumulate``, ``delayed``) runs: ``hook`` itself
    if it is a state, else a new state of the hook it names, with ``options``. ``refused``:
    names the wrapper cannot wrap."""
    if isinstance(hook, HookState):
        if options:
            raise ValueError(f"torch_ringdist.hooks.{wrapper}: options go to the inner hook "
                             "only when it is given by name")
        return hook
    if hook in refused:
        what = "itself" if hook == wrapper else repr(hook)
        raise ValueError(f"torch_ringdist.hooks.{wrapper}: cannot wrap {what}")
    return make_state(hook, process_group=process_group, **options)
