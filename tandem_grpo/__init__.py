"""tandem-grpo: Tandem Reinforcement Learning with Verifiable Rewards (arXiv 2606.28166) for Hugging Face TRL."""

from .config import TandemGRPOConfig
from .handoff import HandoffRule
from .sampling import SamplingSettings
from .trainer import TandemGRPOTrainer

__version__ = "0.2.0.dev0"
__all__ = ["HandoffRule", "SamplingSettings", "TandemGRPOConfig", "TandemGRPOTrainer", "__version__"]
