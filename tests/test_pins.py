"""The pinned set: constraints.txt is what `make constraints` resolves (uv, for Python 3.11 to 3.13), environment.yml
installs it, every dependency of pyproject.toml is pinned, and the tests run in it."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def pins(lines, env=None):
    """{name: version} of the ``name==version`` lines whose marker holds (for ``env``, default this interpreter)."""
    out = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if not line or line.startswith("-"):
            continue
        r = Requirement(line)
        spec = list(r.specifier)
        assert len(spec) == 1 and spec[0].operator == "==", line
        if r.marker is None or r.marker.evaluate(env):
            out[canonicalize_name(r.name)] = spec[0].version
    return out


def _compile_args(root) -> list[str]:
    line = next(l for l in (root / "Makefile").read_text().splitlines() if l.startswith("UV_COMPILE :="))
    return shlex.split(line.split(":=", 1)[1])


def test_constraints_are_what_uv_resolves(root, tmp_path):
    """`make constraints` again, into a copy: the same file. uv keeps every pin it finds that still resolves, so a
    new release on the index changes nothing; a line removed or added by hand, a dependency added to pyproject.toml
    and not pinned, or pins that no longer resolve together for some supported Python and platform do. Needs the
    package index (skipped without it, except in CI)."""
    out = tmp_path / "constraints.txt"
    shutil.copy(root / "constraints.txt", out)
    r = subprocess.run([sys.executable, "-m", "uv", "pip", "compile", *_compile_args(root), "--quiet", "-o", str(out)],
                       cwd=root, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache")})
    if r.returncode and not os.environ.get("CI") and re.search(r"(?i)connect|dns|network|offline", r.stderr):
        pytest.skip("the package index is unreachable: " + r.stderr.strip()[-300:])
    assert r.returncode == 0, r.stderr[-3000:]
    want, got = (root / "constraints.txt").read_text().splitlines(), out.read_text().splitlines()
    assert got == want, "constraints.txt is not what `make constraints` resolves:\n" + "\n".join(
        [f"- {l}" for l in want if l not in got] + [f"+ {l}" for l in got if l not in want])


def test_the_set_holds_for_every_supported_python(root):
    """One pin per package for each of 3.11, 3.12 and 3.13 on Linux, macOS and Windows; the course's own packages
    the same for all of them."""
    lines = (root / "constraints.txt").read_text().splitlines()
    sets = {}
    for py in ("3.11", "3.12", "3.13"):
        for platform, os_name in (("linux", "posix"), ("darwin", "posix"), ("win32", "nt")):
            env = {"python_version": py, "python_full_version": py + ".7", "sys_platform": platform, "os_name": os_name,
                   "platform_machine": "x86_64", "implementation_name": "cpython", "platform_system": platform}
            sets[py, platform] = pins(lines, env)
    for name in ("torch", "numpy", "bitsandbytes", "peft", "transformers", "nbgrader", "dask"):
        assert len({s[name] for s in sets.values()}) == 1, name


def test_environment_yml_installs_the_pinned_set(root):
    env = (root / "environment.yml").read_text().splitlines()
    assert "      - -r constraints.txt" in env
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
    """The environment the tests run in is the pinned one (a drifted venv would test something else), except under
    `make test-latest`, which installs the newest releases on purpose and reports what moved."""
    from importlib.metadata import version

    if os.environ.get("COURSEKIT_UNPINNED") == "1":
        pytest.skip("make test-latest: the newest release of every package, not the pins")

    pip_pins = pins((root / "constraints.txt").read_text().splitlines())
    for name in ("torch", "numpy", "bitsandbytes", "peft", "transformers", "nbgrader", "nbval"):
        assert version(name).split("+")[0] == pip_pins[name], name   # a local build suffix (+cpu, +cu130) is no drift
