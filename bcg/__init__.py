"""bcg: differentiable Unitree G1 motion tracking through stiff contact.

Importing the package is cheap: it neither initialises Warp nor loads a model.
"""

__version__ = "0.1.0"

from bcg._openmp import prefer_passive_openmp_wait as _prefer_passive_openmp_wait

_prefer_passive_openmp_wait()  # before any part of bcg imports torch, whose OpenMP reads OMP_WAIT_POLICY once

from bcg.envs.gl import prefer_headless_gl as _prefer_headless_gl  # noqa: E402

_prefer_headless_gl()  # before any part of bcg imports mujoco, which reads MUJOCO_GL once

from bcg.envs.registration import register_envs as _register_envs  # noqa: E402

_register_envs()
