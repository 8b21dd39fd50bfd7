"""Device code, one kernel family per folder. Importing a family registers its kernels."""

FAMILIES = ("reduce", "softmax", "cross_entropy", "gemm", "norm")


def load_all() -> None:
    """Import every family so that the registry holds all library kernels."""
    import importlib

    for family in FAMILIES:
        importlib.import_module(f"{__name__}.{family}.spec")
