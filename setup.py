"""Packaging hook: configs/ (policy as data, kept at the top of the source tree) ships inside the wheel as
safe_llama/configs, where safe_llama.paths.configs_dir finds it through importlib.resources."""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithConfigs(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads configs/ from the checkout
        target = os.path.join(self.build_lib, "safe_llama", "configs")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree("configs", target)


setup(cmdclass={"build_py": BuildPyWithConfigs})
