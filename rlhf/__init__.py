"""rlhf: RLHF with PPO from first principles (see docs/contract.md, the lab's contract, and README.md).

Importing the package pins the CPU arithmetic before torch is imported (rlhf.runtime): every
entry point (the `rlhf` command, `python -m rlhf`, conftest.py, the tests' subprocesses) goes
through here first. `RLHF_CPU_PIN=off` turns it off.
"""

from rlhf import runtime as _runtime

_runtime.apply()

__version__ = "0.1.0"
