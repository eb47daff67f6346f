"""Tide's four folders install as one namespace: gateway/ is ``tide_fleet.gateway``, and so on.

The folders stay at the top of the repository (the project's layout); the import names are
Tide's own, so no other distribution's import name (Hugging Face's ``kernels``, PyPI's
``tide``) is shadowed. Everything else about the build is in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

FOLDERS = ("gateway", "worker", "kernels", "infra")
NAMESPACE = "tide_fleet"

# Namespace discovery lists the data folders too (kernels/csrc/*, the console's static/),
# so their files ship as package data of packages setuptools knows.
packages = [
    f"{NAMESPACE}.{name}"
    for name in find_namespace_packages(include=[f"{folder}*" for folder in FOLDERS])
    if "__pycache__" not in name
]
setup(
    packages=packages,
    package_dir={f"{NAMESPACE}.{folder}": folder for folder in FOLDERS},
)
