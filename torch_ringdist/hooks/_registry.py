"""The table of ringdist DDP hooks: name -> hook function, state class, state factory.

Imports no hook module, so every hook module can use it: each one adds its own
hooks when imported (``torch_ringdist.hooks`` imports them all), and
``accumulate`` makes its inner hook's state here.
"""
from __future__ import annotations

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
        raise ValueError(f"torch_ringdist.hooks: unknown hook {name!r}; available: {available()}")
    return _HOOKS[name]


def make_state(name: str, **options) -> HookState:
    """A new state for hook ``name`` (options as in :func:`register`)."""
    factory = lookup(name).factory
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
