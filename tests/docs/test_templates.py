"""The gallery's config templates, SLURM batch files and Kubernetes manifest are valid as written."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hasten.commands.config.config_args import load_config_from_file
from hasten.launchers.env import plugin_env

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TEMPLATES = sorted((EXAMPLES / "config_templates").glob("*.yaml"))
SBATCH = sorted((EXAMPLES / "slurm").glob("*.sbatch"))


def test_there_are_templates_and_the_gallery_links_them() -> None:
    assert len(TEMPLATES) >= 5 and len(SBATCH) >= 2
    gallery = (ROOT / "docs" / "examples.md").read_text()
    for path in [*TEMPLATES, *SBATCH, EXAMPLES / "kubernetes" / "pytorchjob.yaml"]:
        assert f"examples/{path.relative_to(EXAMPLES)}" in gallery, path


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_config_template_loads_with_every_key_known(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # deepspeed_json.yaml names its JSON from the repository root
    config = load_config_from_file(str(path))  # unknown keys (engine sections too) raise
    data = yaml.safe_load(path.read_text())
    assert config.to_dict()["distributed_type"] == data["distributed_type"]
    variables = plugin_env(config.to_dict())
    sections = [data[name] for name in ("fsdp_config", "deepspeed_config") if data.get(name)]
    if sections:  # every key of an engine section reaches the workers as a variable
        launcher_only = {"gradient_accumulation_steps"}  # the launcher's own setting
        keys = {key for section in sections for key in section} - launcher_only
        carried = [name for name in variables if not name.startswith("ACCELERATE_USE_")]
        assert len(carried) == len(keys), (keys, variables)
    if "deepspeed_config_file" in data.get("deepspeed_config", {}):
        assert Path(data["deepspeed_config"]["deepspeed_config_file"]).is_file()


@pytest.mark.parametrize("path", SBATCH, ids=lambda p: p.name)
def test_sbatch_file_is_valid_bash_with_well_formed_directives(path: Path) -> None:
    bash = shutil.which("bash")
    assert bash is not None
    result = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    lines = path.read_text().splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line for line in lines if line.startswith("#SBATCH")]
    assert directives and all(re.fullmatch(r"#SBATCH --[a-z-]+(=\S+)?", d) for d in directives)
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(lines.index(d) < first_command for d in directives)  # sbatch stops reading there


def test_pytorchjob_manifest_has_master_and_workers_and_matches_the_docs() -> None:
    path = EXAMPLES / "kubernetes" / "pytorchjob.yaml"
    job = yaml.safe_load(path.read_text())
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"} and specs["Master"]["replicas"] == 1
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"  # the name the operator looks for
        assert container["image"] and container["command"][0] == "torchrun"
    body = "".join(
        line + "\n" for line in path.read_text().splitlines() if not line.startswith("#")
    )
    assert body in (ROOT / "docs" / "clusters.md").read_text()  # one manifest, shown and shipped
