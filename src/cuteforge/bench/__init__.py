"""Measuring the library: `library` (the table of library ops and `measure` of one shape
against torch and quack) and `report` (`cuteforge bench` / `cuteforge library`, the
recorded-results format, tables, plots, HTML)."""
