"""bcg: differentiable Unitree G1 motion tracking through stiff contact.

Importing the package is cheap: it neither initialises Warp nor loads a model.
"""

__version__ = "0.1.0"

from bcg.envs.registration import register_envs as _register_envs

_register_envs()
