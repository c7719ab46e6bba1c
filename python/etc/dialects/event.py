"""The `event` dialect: op classes generated from EventOps.td."""

from ._event_ops_gen import *  # noqa: F401,F403
from ._event_ops_gen import _Dialect  # noqa: F401
