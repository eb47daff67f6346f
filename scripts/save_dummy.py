#!/usr/bin/env python3
"""Save a random-weight model (dummy:PRESET) as a Hugging Face folder.

    python scripts/save_dummy.py bench /tmp/tide-bench [--seed 0]

transformers.AutoModelForCausalLM.from_pretrained(folder) then loads the very same
weights that Tide's engine runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.worker.models.dummy import DEFAULT_SEED, PRESETS, save_dummy


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args()
    folder = save_dummy(args.preset, args.out, args.seed)
    params = ModelConfig.from_folder(folder).num_parameters()
    print(
        f"saved dummy:{args.preset} (seed {args.seed}, {params / 1e6:.1f}M parameters) to {folder}"
    )


if __name__ == "__main__":
    main()
