"""Generated template modules (`<cache root>/src/`), importable by name.

Compile workers import a variant's module as `cuteforge.templates.generated.v<hash>`.
The package has no search path of its own: `codecache` installs the finder that serves
these names from verified source files, never from bytecode.
"""

from .. import codecache  # noqa: F401  (installs the finder)

__path__: list[str] = []
