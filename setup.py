"""Build hooks for lightning-xpu (project metadata lives in setup.cfg / pyproject.toml).

``build_py`` also places ``lightning_xpu_emulator.pth`` at the root of the build, so a wheel installs it into
site-packages: the interpreter then runs it at start-up, and it enables the XPU emulator after ``import torch``
only when LIGHTNING_XPU_EMULATOR is set (it does nothing else). Editable installs do not get the file; run
``python -m lightning_xpu.emulator --install-hook`` there.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "lightning_xpu_emulator.pth"


class BuildPyWithStartupHook(build_py):
    """build_py that also ships the emulator's start-up ``.pth`` file at the top level."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_file(PTH, os.path.join(self.build_lib, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list:
        outputs = super().get_outputs(include_bytecode)
        if not self.editable_mode:
            outputs.append(os.path.join(self.build_lib, PTH))
        return outputs


setup(cmdclass={"build_py": BuildPyWithStartupHook})
