"""Entry point for torch.backends, so that `import torch` alone brings up device "tpu".

Kept outside torchtpu/__init__.py: when a program imports torchtpu first, torch's autoload runs
while torchtpu is still initializing, and this module must then do nothing."""


def load() -> None:
    try:
        import torchtpu  # noqa: F401  (a partially initialized torchtpu finishes on its own)
    except Exception as e:  # `import torch` must survive a broken torchtpu install
        import warnings

        warnings.warn(f"torchtpu could not be loaded: {e}")
