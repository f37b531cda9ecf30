"""``serve`` hides start-up's objects from the cyclic garbage collector once the first frame is out.

Without it, every full collection walks the ~80,000 objects of modules and clients while
holding the GIL (pauses of up to 70 ms at ``scale``, which scrapes wait out; see
``python3 -m benchmarks.run --only gc``). Checked in a child process: freezing is process-wide.
"""

from __future__ import annotations

import json
import subprocess
import sys

from dra_exporter.runtime import GC_YOUNG_THRESHOLD

PROGRAM = """
import gc, json, threading
from dra_exporter import runtime
from dra_exporter.config import Settings

before = gc.get_freeze_count(), gc.get_threshold()[0]
stop = threading.Event()
server = threading.Thread(target=runtime.serve, args=(Settings(listen="127.0.0.1:0", simulate="demo"),),
                          kwargs={"stop": stop})
server.start()
for _ in range(300):
    if gc.get_freeze_count():
        break
    stop.wait(0.1)
after = gc.get_freeze_count(), gc.get_threshold()[0]
stop.set()
server.join(30)
print(json.dumps({"before": before, "after": after, "still_serving": server.is_alive()}))
"""


def test_serve_freezes_start_up_objects_and_collects_young_ones_less_often() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    (frozen_before, threshold_before), (frozen_after, threshold_after) = seen["before"], seen["after"]
    assert frozen_before == 0 and threshold_before != GC_YOUNG_THRESHOLD  # CPython's defaults
    assert frozen_after > 10_000, "start-up's objects (modules, clients, the simulated node) are frozen"
    assert threshold_after == GC_YOUNG_THRESHOLD
    assert not seen["still_serving"], "serve stopped when asked"
