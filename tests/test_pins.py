"""The pinned sets agree: constraints.txt (pip) and environment.yml (conda) list the same versions,
and every dependency of pyproject.toml is pinned."""

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PIN = re.compile(r"^\s*-?\s*([A-Za-z0-9_.\-\[\]]+)==([^\s#]+)\s*$")


def pins(lines):
    out = {}
    for line in lines:
        m = PIN.match(line)
        if m:
            out[canonicalize_name(m.group(1))] = m.group(2)
    return out


def test_constraints_and_environment_agree(root):
    pip_pins = pins((root / "constraints.txt").read_text().splitlines())
    env = (root / "environment.yml").read_text().splitlines()
    pip_section = env[env.index("  - pip:") + 1:]
    conda_pins = pins(pip_section)
    assert len(pip_pins) > 50
    only_pip = sorted(set(pip_pins) - set(conda_pins))
    only_conda = sorted(set(conda_pins) - set(pip_pins))
    differ = {k: (pip_pins[k], conda_pins[k]) for k in set(pip_pins) & set(conda_pins) if pip_pins[k] != conda_pins[k]}
    assert not only_pip and not only_conda and not differ, (only_pip, only_conda, differ)
    assert "  - python>=3.11,<3.14" in env


def test_course_packages_are_pinned(root):
    pip_pins = pins((root / "constraints.txt").read_text().splitlines())
    meta = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    reqs = meta["dependencies"] + meta["optional-dependencies"]["dev"]
    missing = [r for r in reqs if canonicalize_name(Requirement(r).name) not in pip_pins]
    assert not missing, f"unpinned in constraints.txt: {missing}"
    assert pip_pins["torch"] == "2.13.0"
    for name in ("bitsandbytes", "peft", "transformers", "gguf", "nbgrader", "nbval", "jupyterlab",
                 "matplotlib", "numpy", "pytest", "ipywidgets", "tqdm", "hypothesis"):
        assert name in pip_pins, name


def test_installed_versions_match_the_pins(root):
    """The environment the tests run in is the pinned one (a drifted venv would test something else)."""
    from importlib.metadata import version

    pip_pins = pins((root / "constraints.txt").read_text().splitlines())
    for name in ("torch", "numpy", "bitsandbytes", "peft", "transformers", "nbgrader", "nbval"):
        assert version(name).split("+")[0] == pip_pins[name], name   # a local build suffix (+cpu, +cu130) is no drift
