"""TEMPORARY stub (replaced by the preprocessing branch)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class InputConfig:
    input_size: tuple = (224, 224, 3)
    mean: tuple = (123.675, 116.28, 103.53)
    std: tuple = (58.395, 57.12, 57.375)
    crop_fraction: float = 0.875
    interpolation: str = "bilinear"
