"""rlhf: RLHF with PPO from first principles (see ../shared/SPEC.md and README.md)."""
__version__ = "0.1.0"
