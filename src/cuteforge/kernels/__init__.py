"""Device code, one kernel family per folder. Importing a family registers its kernels
and their tuning problems (`autotune.problems`)."""

FAMILIES = ("reduce", "softmax", "cross_entropy", "gemm", "norm", "pointwise")


def load_all() -> None:
    """Import every family so that the registries hold all library kernels and their
    tuning problems."""
    import importlib

    for family in FAMILIES:
        importlib.import_module(f"{__name__}.{family}")
