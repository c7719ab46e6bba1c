"""Lets the op classes generated for ETC's dialects import the upstream helpers
they expect beside them (they are generated for `mlir.dialects`)."""

from mlir.dialects._ods_common import *  # noqa: F401,F403
from mlir.dialects._ods_common import _cext  # noqa: F401
