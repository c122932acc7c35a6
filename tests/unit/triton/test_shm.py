"""What a stopped Triton leaves in /dev/shm is removed by prefix: its own regions, no other's."""

from __future__ import annotations

from pathlib import Path

from tensorrtllm_backend import launcher
from trtllm_service.triton.shm import region_prefixes, remove_regions


def test_the_launchers_prefixes_are_read_and_only_their_regions_removed(tmp_path: Path) -> None:
    args = launcher.build_parser().parse_args(["--model_repo", str(tmp_path), "--world_size", "2"])
    install = launcher.TritonInstall(binary="/bin/tritonserver", backend_dir=None)
    command = launcher.build_command(args, install, unique=77, mpirun="mpirun", python="python3")
    assert region_prefixes(command) == ["prefix0_77_", "prefix1_77_"]
    ours = ["prefix0_77_123_ab-cd", "prefix1_77_456_ef"]
    others = ["prefix0_771_9_x", "prefix0_7_77_y", "prefix2_77_z", "unrelated"]
    for name in ours + others:
        (tmp_path / name).write_bytes(b"\0" * 16)
    assert sorted(remove_regions(command, tmp_path)) == ours
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == sorted(others)
