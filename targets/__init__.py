"""attnzoo.targets: one folder per deployment technology, each everything of it in one place.

Each sub-package defines ``TARGET``, an :class:`attnzoo.runtime.targets.Target`: its backends (how it runs a model),
its export format if it has one, the schemas of the reports it writes, its own options and whether its library is
installed here. The registries of the layers below read them (:func:`attnzoo.runtime.targets.targets`); nothing
else names a target, so a new technology is a new folder here, or an installed package's ``attnzoo.targets`` entry
point (docs/architecture.md, "Adding a target").
"""
