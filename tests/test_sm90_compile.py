"""tools/sm90_compile.py on a kernel that Triton's interpreter runs but its compiler refuses: an int argument equal to
1 is made a constant, which has no .to(). The tool must fail that launch, and pass the kernel that keeps r a value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.nvidia")

ROOT = Path(__file__).resolve().parents[1]
KERNEL_TEST = '''
import torch, triton, triton.language as tl

@triton.jit{options}
def _shift(o_ptr, r):
    shift = (r + 1).to(tl.int32)
    tl.store(o_ptr, shift)

def test_rounds():
    o = torch.zeros(1, dtype=torch.int32)
    for r in (0, 1, 2):
        _shift[(1,)](o, r)
'''


@pytest.mark.parametrize(("options", "fails"), [("", True), ("(do_not_specialize=['r'])", False)])
def test_a_launch_the_compiler_refuses_fails_the_tool(tmp_path: Path, options: str, fails: bool) -> None:
    (tmp_path / "test_kernel.py").write_text(KERNEL_TEST.format(options=options))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "sm90_compile.py"), str(tmp_path / "test_kernel.py")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == (1 if fails else 0), run.stdout[-3000:] + run.stderr[-3000:]
    summary = "3 launches compiled" if not fails else "2 launches compiled over 1 kernels, 1 failed to compile"
    assert summary in run.stdout, run.stdout[-3000:]
    assert ("'int' object has no attribute 'to'" in run.stdout) == fails
