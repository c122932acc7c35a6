"""Gives an installed distribution another version label (the image double's torch: PyTorch's CPU wheel,
labelled as the image's 2.10.0a0 so that TensorRT-LLM's pin torch<=2.10.0a0 holds as in the image).

usage: python relabel_dist.py NAME VERSION
"""

import importlib.metadata
import sys
from pathlib import Path

name, version = sys.argv[1:3]
dist = importlib.metadata.distribution(name)
info = Path(dist._path)  # type: ignore[attr-defined]  # PathDistribution's private _path: the .dist-info folder
metadata = info / "METADATA"
lines = metadata.read_text().splitlines()
metadata.write_text(
    "\n".join(f"Version: {version}" if line.startswith("Version: ") else line for line in lines) + "\n"
)
info.rename(info.with_name(f"{dist.metadata['Name'].replace('-', '_')}-{version}.dist-info"))
print(f"{name} {dist.version} is now labelled {version}")
