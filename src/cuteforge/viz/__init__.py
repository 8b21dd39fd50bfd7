"""CuTe layout visualisation in pure Python: parse, evaluate and draw layouts as SVG/PNG.

Nothing here needs a GPU or imports ``cutlass``: layouts are parsed from CuTe notation
(``"(4,8):(8,1)"``) or taken from any object with static ``shape``/``stride`` (a DSL
``cute.Layout`` built at trace time works).

* ``layout.py``: the layout algebra (parse, index, ``make_layout_tv``);
* ``svg.py``: drawing (``render``, ``render_tv``, ``save`` as SVG or PNG);
* ``dsl.py``: tiled copies and MMAs of the DSL, MMA presets, the ``cuteforge viz`` backend.
"""

from .dsl import MMA_PRESETS, main_viz, render_mma_preset, render_tiled_copy, render_tiled_mma
from .layout import IntTuple, Layout, make_layout_tv, parse_layout
from .svg import PNG_MAX_PX, SVG, crop, parse_crop, render, render_tv, save

__all__ = ["MMA_PRESETS", "PNG_MAX_PX", "SVG", "crop", "parse_crop", "IntTuple", "Layout", "main_viz", "make_layout_tv", "parse_layout", "render",
           "render_mma_preset", "render_tiled_copy", "render_tiled_mma", "render_tv", "save"]
