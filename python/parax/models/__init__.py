"""Model builder: a Hugging Face style config -> parax IR text.

    from parax.models import load_config, build_model
    cfg = load_config("llama3-8b")            # a preset name or a config.json path
    text = build_model(cfg, batch=1, seq=2048)
"""

from .config import ModelConfig, load_config
from .builder import build_model
from .presets import PRESETS

__all__ = ["ModelConfig", "load_config", "build_model", "PRESETS"]
