"""Names a package imports at first use (PEP 562), shared by the packages that defer some."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, names: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, for ``names``: name -> module.

    A module is relative to ``package``. A name, once imported, is stored in ``namespace``
    (the package's globals), so later lookups do not come back here.
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        # The lazy names too, for dir() and completion, before their first use.
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
