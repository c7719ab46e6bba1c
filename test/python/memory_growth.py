"""How much a model's process grows in resident memory: the model loaded
(its step kernel from a compile cache) and run in a fresh process, for the
tests that a model holds about its file (test_gguf_packed_models,
test_fp8_checkpoints)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, sys
    import etc.models as models

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024

    path, cache, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    before = status("VmRSS:")
    model = models.load(path, cache=cache, **options)
    model.generate([[1, 2, 3]], 4)
    print(json.dumps({"before": before, "peak": status("VmHWM:"),
                      "source": model.kernel_source}))
""")


#: The load options besides the caller's.
LOAD = dict(workers=2, max_seq_len=64, attention_chunk=16)


def grown(path, cache, **options) -> int:
    """Bytes the peak resident memory of a process grows by while it loads
    `path` with `options` (JSON-able keywords of `etc.models.load`) and
    generates 4 tokens. The step kernel is compiled first, in this process,
    into `cache`, so that the process measured loads it."""
    import etc.models as models

    options = {**LOAD, **options}
    models.load(path, cache=cache, **options)
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(path), str(cache),
                          json.dumps(options)],
                         capture_output=True, text=True, timeout=600, check=True)
    run = json.loads(out.stdout.strip().splitlines()[-1])
    assert run["source"] == "cache", run
    return run["peak"] - run["before"]
