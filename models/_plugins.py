"""The variant plugins: the entry points of the group ``attnzoo.variants``, run once at the first lookup of a
variant name, each in a sandbox (:class:`PluginLoader`).

A plugin that fails to import or register, calls ``sys.exit``, takes longer than
:data:`attnzoo.limits.PLUGIN_REGISTER_TIMEOUT_S` or changes a built-in's entry is named in one
:class:`PluginWarning` and undone (the registry's tables as they were before it ran); the other plugins still
load. The registry (:mod:`attnzoo.models.registry`) keeps registration and lookup and asks its loader here.
"""

from __future__ import annotations

import sys
import threading
import warnings
from importlib import metadata
from typing import Any

from attnzoo import limits
from attnzoo.errors import first_line
from attnzoo.modelconfig import VARIANT_ENTRY_POINTS
from attnzoo.signals import Interrupted, Terminated

__all__ = ["BUILTIN_PACKAGE", "ENTRY_POINT_GROUP", "PluginWarning", "PluginLoader", "package_of"]

#: The distribution the built-in variants come from.
BUILTIN_PACKAGE = "attnzoo"
#: Entry-point group of third-party variant packages: each entry point is a zero-argument callable that calls
#: :func:`attnzoo.models.register_variant`.
ENTRY_POINT_GROUP = VARIANT_ENTRY_POINTS

#: The registry's tables as they were before a plugin ran: (order, entries, aliases).
Snapshot = tuple[list[str], dict[str, Any], dict[str, str]]


class PluginWarning(UserWarning):
    """A variant plugin failed to load or was refused (its other variants and other plugins still load)."""


def package_of(attn_layer: type) -> tuple[str, str]:
    """``(distribution, version)`` of the installed package that defines ``attn_layer`` (registered outside an
    entry point); a module that no installed distribution provides (a script, a notebook: ``__main__``) gives
    ``(module, "")``, and such a variant's checkpoints record no plugin to install."""
    top = attn_layer.__module__.split(".")[0]
    if top == BUILTIN_PACKAGE:
        return BUILTIN_PACKAGE, ""
    for dist in metadata.packages_distributions().get(top, []):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return top, ""


def _importing(module: str) -> bool:
    """Whether ``module`` is being imported right now (it imported ``attnzoo.models``, which loads plugins)."""
    spec = getattr(sys.modules.get(module), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


class PluginLoader:
    """Runs the installed plugins once over the registry's tables, each sandboxed.

    Args:
        order: The canonical names in registration order (the registry's list, changed in place).
        variants: Name (aliases included) -> spec (the registry's dict; read and written with ``dict``'s own
            methods, so that no lookup loads the plugins again).
        aliases: Alias -> canonical name.

    Attributes:
        loaded: Whether :meth:`load` has run (it runs once, at the first lookup); ``loading``: it is running now.
        lock: Held while plugins load: another thread's first lookup waits for them; the loading thread re-enters.
        register_lock: Held while the registry changes, so that a skipped plugin's late registration cannot
            interleave with its undoing.
        running: (package, version) of the plugin whose entry point is running, while :meth:`load` runs it.
        deferred: Entry points whose module was mid-import when :meth:`load` ran (:meth:`load_deferred`).
        runners: The threads running an entry point (:meth:`_run_bounded`): their own lookups do not wait.
        abandoned: Those that did not return in time: their plugin was skipped, and nothing they register later
            is kept.
    """

    def __init__(self, order: list[str], variants: dict[str, Any], aliases: dict[str, str]) -> None:
        self.order, self.variants, self.aliases = order, variants, aliases
        self.loaded, self.loading = False, False
        self.lock = threading.RLock()
        self.register_lock = threading.Lock()
        self.running: list[tuple[str, str]] = []
        self.deferred: list[Any] = []
        self.runners: set[threading.Thread] = set()
        self.abandoned: set[threading.Thread] = set()

    def source(self, attn_layer: type) -> tuple[str, str]:
        """``(package, version)`` a registration of ``attn_layer`` comes from: the plugin whose entry point is
        running, else the installed package that defines the class (:func:`package_of`)."""
        return self.running[-1] if self.running else package_of(attn_layer)

    def refused(self) -> bool:
        """Whether this thread runs a plugin that was skipped (its entry point did not return in time)."""
        return threading.current_thread() in self.abandoned

    # ------------------------------------------------------------------------------ the sandbox
    def _snapshot(self) -> Snapshot:
        """The whole registry (order, entries, aliases), to put back when a plugin is skipped."""
        return list(self.order), dict(dict.items(self.variants)), dict(self.aliases)

    def _restore(self, snapshot: Snapshot) -> None:
        """Undo a skipped plugin: the registry as it was before it ran."""
        order, variants, aliases = snapshot
        with self.register_lock:
            self.order[:] = order
            dict.clear(self.variants)
            dict.update(self.variants, variants)
            self.aliases.clear()
            self.aliases.update(aliases)

    def _changed_builtins(self, snapshot: Snapshot) -> list[str]:
        """Built-in names (and aliases) whose entry or place a plugin changed or removed."""
        order, variants, aliases = snapshot
        builtin = [n for n in order if variants[n].builtin]
        changed = [n for n, s in variants.items() if s.builtin and dict.get(self.variants, n) is not s]
        changed += [a for a, n in aliases.items() if variants[n].builtin and self.aliases.get(a) != n]
        if [n for n in self.order if n in builtin] != builtin:
            changed += [n for n in builtin if n not in self.order] or ["(their order)"]
        return list(dict.fromkeys(changed))

    def _run_bounded(self, ep: Any) -> None:
        """``ep.load()()`` in a thread of its own, waited for at most
        :data:`attnzoo.limits.PLUGIN_REGISTER_TIMEOUT_S`; what it raised is raised here. One that is still running
        then is left to run (a daemon thread: it never holds the process at exit), and a ``ValueError`` says so;
        anything it registers afterwards is refused."""
        raised: list[BaseException] = []

        def run() -> None:
            try:
                ep.load()()
            except BaseException as exc:  # handed to the loading thread, which judges it
                raised.append(exc)

        worker = threading.Thread(target=run, name=f"attnzoo-plugin-{ep.name}", daemon=True)
        self.runners.add(worker)
        worker.start()
        try:
            worker.join(limits.PLUGIN_REGISTER_TIMEOUT_S)  # Ctrl-C and SIGTERM still reach this thread while it waits
        finally:
            with self.register_lock:
                if worker.is_alive():
                    self.abandoned.add(worker)
                else:
                    self.runners.discard(worker)
        if worker in self.abandoned:
            raise ValueError(
                f"its entry point did not return within {limits.PLUGIN_REGISTER_TIMEOUT_S:g} s "
                "(PLUGIN_REGISTER_TIMEOUT_S in attnzoo/limits.py)"
            )
        if raised:
            raise raised[0]

    def _run_entry_point(self, ep: Any) -> list[str]:
        """Run one entry point; return the names it registered (none, and one :class:`PluginWarning`, on failure).

        Guarded: anything the plugin raises, ``SystemExit`` included, skips it with one warning naming it (only
        Ctrl-C and the command's own termination signals pass through); so does a plugin that replaced or removed a
        built-in's entry (the entry is put back), and one whose import and ``register()`` take longer than
        :data:`attnzoo.limits.PLUGIN_REGISTER_TIMEOUT_S` (:meth:`_run_bounded`)."""
        dist = getattr(ep, "dist", None)
        package = dist.metadata["Name"] if dist is not None else ep.value.split(":")[0].split(".")[0]
        version = dist.version if dist is not None else ""
        before, start = self._snapshot(), len(self.order)
        self.running.append((package, version))
        try:
            self._run_bounded(ep)
            changed = self._changed_builtins(before)
            if changed:
                raise ValueError(f"it changed the built-in variant entries {', '.join(map(repr, changed))}")
        except (KeyboardInterrupt, Interrupted, Terminated):
            self._restore(before)
            raise
        except BaseException as exc:  # third-party code, SystemExit too: one warning, keep going
            self._restore(before)
            if isinstance(exc, SystemExit):
                reason = f"it called sys.exit({exc.code!r})"
            else:
                reason = str(exc) if isinstance(exc, ValueError) else first_line(exc, typed=True)
            # one line on stderr: "attnzoo.variants:0: PluginWarning: ..." (no source line follows: no such file)
            warnings.warn_explicit(
                f"attnzoo variant plugin {ep.name!r} ({package} {version}) skipped: {reason}",
                PluginWarning,
                ENTRY_POINT_GROUP,
                0,
            )
            return []
        finally:
            self.running.pop()
        return self.order[start:]

    # ------------------------------------------------------------------------------ when they load
    def ensure(self) -> None:
        """Run :meth:`load` once, at the first lookup of a variant (not at import)."""
        if self.loaded or _importing(__package__ or "attnzoo.models"):
            return  # loaded; or the package itself is importing (the built-ins are not all registered yet)
        if threading.current_thread() in self.runners:
            return  # a plugin's own lookups, in the thread that runs it: they must not wait for the plugins
        with self.lock:
            if not self.loaded and not self.loading:  # a plugin's own lookups must not load again
                self.load()

    def load(self) -> list[str]:
        """Run every entry point of the group ``attnzoo.variants``; return the names they registered (see
        :func:`attnzoo.models.registry.load_plugins`)."""
        added: list[str] = []
        with self.lock:
            self.loading = True
            try:
                for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
                    if _importing(ep.module):
                        self.deferred.append(ep)
                    else:
                        added += self._run_entry_point(ep)
            finally:
                self.loading = False
                self.loaded = True
        return added

    def load_deferred(self) -> None:
        """Run the entry points :meth:`load` deferred whose modules have finished importing."""
        for ep in [ep for ep in self.deferred if not _importing(ep.module)]:
            self.deferred.remove(ep)
            self._run_entry_point(ep)
