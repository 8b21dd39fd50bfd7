"""Kernel templates: Jinja2 CuTe DSL sources with autotunable parameters and fusion.

`Template` (template.py) binds a call to a variant kernel (variant.py: a cuteforge
`Kernel` whose configs are parameter sets), renders through the hooks in render.py and
keeps rendered sources in the code cache (codecache.py). See docs/templates.md.
"""

from .render import TemplateError, TensorNode
from .template import TEMPLATES, Template, TemplateChoice, grid
from .variant import TemplateConfig, TemplateKernel

__all__ = ["TEMPLATES", "Template", "TemplateChoice", "TemplateConfig", "TemplateError", "TemplateKernel", "TensorNode", "grid"]
