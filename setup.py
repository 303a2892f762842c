"""PEARL for SGLang: an elastic, PD-adaptive rollout layer for agentic RL."""
from setuptools import find_packages, setup

ENGINE = [
    "sglang==0.5.23",
    "sgl-kernel",
    "torch",
    "torch-memory-saver",
    "mooncake-transfer-engine",
]
TEST = [
    "pytest>=8",
    "pytest-asyncio>=0.23",
    "pytest-timeout>=2.3",
    "hypothesis>=6.100",
    "openai>=1.40",
    "httpx>=0.27",
    "numpy>=1.26",
    "safetensors>=0.4",
    "tokenizers>=0.19",
    "ray>=2.40",
]
RAY = ["ray[default]>=2.40"]
BENCH = ["matplotlib>=3.8", "numpy>=1.26"]

setup(
    name="pearl-sglang",
    version="0.1.0",
    description="PEARL: elastic prefill-decode rollout for agentic RL, as an SGLang router",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["pearl_sglang*", "pearl_rl_adapter*"]),
    package_data={"pearl_sglang": ["emulator/profiles/*.json", "workload/presets/*.json", "data/*"]},
    install_requires=[
        "aiohttp>=3.9",
        "numba>=0.60",  # the emulator's decode stretches draw their tokens compiled
        "numpy>=1.26",  # the emulator's token model and the workload generator
        "orjson>=3.9",
        "prometheus-client>=0.20",
        "pyyaml>=6.0",
        "uvloop>=0.19; sys_platform != 'win32'",  # the router's event loop (SGLang depends on it too)
    ],
    extras_require={
        "test": TEST + BENCH,
        "ray": RAY,
        "bench": BENCH,
        "demo": BENCH,
        "engine": ENGINE,
        "all": TEST + RAY + BENCH,
    },
    entry_points={"console_scripts": ["pearl-router=pearl_sglang.router.__main__:main"]},
)
