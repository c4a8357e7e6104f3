"""Packaging for ``snapshot`` (distributed as ``datapipe-snapshot``). Runtime: torch, dill, tqdm, msgpack and msgspec."""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
_VERSION_PY = (HERE / "snapshot/_version.py").read_text()
VERSION = re.search(r'__version__ = "([^"]+)"', _VERSION_PY).group(1)
# `snapshot` on the package index is an unrelated project: the distribution has its own name,
# the import name and the command stay `snapshot`.
DISTRIBUTION = re.search(r'DISTRIBUTION = "([^"]+)"', _VERSION_PY).group(1)

# torch: a range that 2.13.0 satisfies, bounded above so that a fresh install never pulls a
# newer (multi-GB CUDA) build by surprise.
TORCH = "torch>=2.4,<2.14"

EXTRAS = {
    "torchdata": ["torchdata==0.9.0"],
    # integrations (snapshot.integrations.*): each tool is an extra of its own
    "accelerate": ["accelerate>=1.0,<2"],
    "lightning": ["lightning>=2.3,<3"],
    # torchdata >= 0.10 (StatefulDataLoader, torchdata.nodes) has no DataLoader2: it cannot share
    # an environment with the "torchdata" extra (the test suite keeps it in .venv-torchdata)
    "torchdata-nodes": ["torchdata>=0.10,<0.12"],
    # snapshots behind fsspec URLs (s3://, gs://, memory://): see snapshot/storage/_fsspec.py
    "storage": ["fsspec>=2023.1", "s3fs>=2023.1"],
    # the docs site and executed notebook tutorials (see docs/ and tutorials/). The site
    # builder and its plugins are pinned: their upgrades add warnings, and the build is strict.
    "docs": [
        "mkdocs==1.6.1",
        "mkdocs-material==9.8.1",
        "mkdocstrings==1.0.8",
        "mkdocstrings-python==2.0.11",
        "griffelib==2.4.1",
        "mkdocs-autorefs==1.4.5",
        "pymdown-extensions==13.1",
        "jupytext>=1.16,<2",
        "nbformat>=5.9,<6",
        "nbclient>=0.10,<0.12",
        "ipykernel>=6.29,<8",
        "matplotlib>=3.8,<4",
        "mkdocs-jupyter==0.26.3",
    ],
    # what the test suite needs for the `snapshot` command's tests (fuzzing, pictures)
    "cli": [],
    # `make demo` (examples/demo.py): the runtime, and numpy, without which torch warns on import
    "demo": ["numpy>=1.26"],
}
TESTING = [
    "numpy>=1.26",
    "pytest>=8.0",
    "pytest-timeout>=2.3",
    "pytest-xdist>=3.8",  # `make test` runs the suite on 2 processes (most tests wait on subprocesses); 3.8: --no-loadscope-reorder
    "hypothesis>=6.100",
]
EXTRAS["dev"] = EXTRAS["demo"] + EXTRAS["docs"] + EXTRAS["cli"] + EXTRAS["accelerate"] + EXTRAS["lightning"] + TESTING + [
    *EXTRAS["storage"],
    "moto[server]>=5.0,<6",  # the S3-compatible server tests/storage/test_s3.py starts
    "torchdata==0.9.0",
    "protobuf>=3.20,<3.21",  # torchdata 0.9's load_from_tfrecord: its generated code needs protobuf 3.20
    "ruff==0.17.6",
    "mypy==2.4.1",
]
# the second test environment (.venv-torchdata, made by `make test`): torchdata >= 0.10
EXTRAS["dev-torchdata-nodes"] = EXTRAS["torchdata-nodes"] + TESTING

setup(
    name=DISTRIBUTION,
    version=VERSION,
    description="Exact, portable snapshots of PyTorch DataPipe graphs, and a maintained DataLoader2",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    python_requires=">=3.10",
    packages=find_packages(include=["snapshot", "snapshot.*"]),
    package_data={"snapshot": ["py.typed"]},
    # tqdm: progress bars of long restores and saves (pure Python; snapshot runs without it);
    # msgpack: the state's data encoding (a C extension with wheels for every platform torch has, no deps);
    # msgspec: reads a manifest in C (snapshot/schema/_native.py; one small wheel, no deps; without it, in Python)
    install_requires=[TORCH, "dill>=0.3.8", "tqdm>=4.66", "msgpack>=1.0.5,<2", "msgspec>=0.18"],
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["snapshot=snapshot.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
