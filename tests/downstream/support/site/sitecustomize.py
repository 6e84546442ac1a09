"""Interpreter start-up for the downstream tier's subprocesses (the ``anomalib`` CLI).

The tests start them with this folder and ``tests/downstream/support`` on PYTHONPATH, so torchvision's operators are
declared before anything imports torchvision (``torchvision_ops.py``) and ``device_probe.DeviceProbe`` can be named as
a callback.
"""

import torchvision_ops

torchvision_ops.define_missing_operators()
