"""Generated template modules (`<cache root>/src/`), importable by name.

Compile workers import a variant's module as `cuteforge.templates.generated.v<hash>`;
this package's path is the source cache directory, so that import finds the file. The
parent process loads generated modules through `codecache.load`.
"""

from ..codecache import src_dir

__path__ = [str(src_dir())]
