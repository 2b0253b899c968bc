"""Install the AI-fabric testbed: the `testbed`, `controllers` and `traffic` packages.

Mininet and Open vSwitch come from the distribution (see scripts/install.sh): the PyPI
`mininet` is a stale build without `mnexec`, so the venv is made with --system-site-packages.
"""
from setuptools import Extension, find_packages, setup

# The GPU NIC's system-call edge in C (traffic/nicio.py falls back to Python without it).
NICIO = Extension("traffic._nicio", ["traffic/_nicio.c"], libraries=["z"], optional=True,
                  extra_compile_args=["-O2"])

setup(
    name="ai-fabric-testbed",
    version="0.1.0",
    description="Emulate leaf-spine AI-training fabrics with real RoCEv2 traffic",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=find_packages(include=["testbed", "testbed.*", "controllers", "traffic"]),
    package_data={"testbed.scenario": ["builtin/*.yaml", "builtin/jobs/*.yaml"]},
    ext_modules=[NICIO],
    install_requires=[
        "os-ken>=4.0,<5",
        "scapy>=2.6,<2.9",
        "pyroute2>=0.7.9,<0.10",
        "numpy>=1.24,<3",
        "pyyaml>=6.0,<7",
        "matplotlib>=3.6,<4",  # the report's plots (Agg backend, no display needed)
        "protobuf>=4.21,<7",  # Chakra execution traces (their wire format)
    ],
    extras_require={"test": ["pytest>=7.2,<10", "hypothesis>=6.80,<7"]},
    entry_points={"console_scripts": ["testbed=testbed.cli:main"],
                  "pytest11": ["testbed = testbed.pytest_plugin"]},
)
