"""``bcg-aobg``: the alpha-order batched-gradient estimator (docs/method.md §4.1, Suh et al. 2022) for ``bcg``, a
third-party plugin. Installing the distribution registers it under the name ``aobg`` through the ``bcg.estimators``
entry point; importing :mod:`bcg_aobg.estimator` registers it too (decorator).

* :class:`bcg_aobg.estimator.AOBG`: the estimator (a frozen dataclass of hyperparameters).
* :mod:`bcg_aobg.mix`: the estimator-free parts: per-branch first- and zeroth-order samples, the mix and the
  bias-constrained choice of alpha.
"""

from __future__ import annotations

__all__ = ["AOBG", "AlphaStats", "bias_constrained_alpha", "zobg_samples"]


def __getattr__(name: str):  # lazy, so `import bcg_aobg` does not import torch or bcg
    if name in ("AOBG", "AlphaStats"):
        from bcg_aobg import estimator

        return getattr(estimator, name)
    if name in ("bias_constrained_alpha", "zobg_samples"):
        from bcg_aobg import mix

        return getattr(mix, name)
    raise AttributeError(f"module 'bcg_aobg' has no attribute {name!r}")
