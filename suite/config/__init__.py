"""Ground floor: run and model configs, sizes, paths, ConfigError, did-you-mean; imports nothing of ours."""
