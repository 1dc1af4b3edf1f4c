"""The trainers `--trainer` knows, and the module that runs each one's own preprocessing (its adapter) and
the one that writes its input format (`prefdata export`). Kept here, below settings, so the flags' choices
and prefdata.trainers read one list. A module here is imported only when its trainer is asked for."""

# name -> adapter module: parse_args(items) -> settings;
# run(rows, tokenizer_path, trust_remote_code, settings, python=None) -> prefdata.trainers.common.TrainerRun
TRAINER_ADAPTERS: dict[str, str] = {
    "openrlhf": "prefdata.trainers.openrlhf_adapter",
    "trl": "prefdata.trainers.trl_adapter",
    "llamafactory": "prefdata.trainers.llamafactory_adapter",
    "axolotl": "prefdata.trainers.axolotl_adapter",
}

# name -> export module: export(out_dir, export_dir, trainer_args, overwrite) -> an object with .summary()
TRAINER_EXPORTS: dict[str, str] = {
    "openrlhf": "prefdata.trainers.export_openrlhf",
    "axolotl": "prefdata.trainers.export_axolotl",
    "llamafactory": "prefdata.trainers.export_llamafactory",
}

TRAINERS: tuple[str, ...] = tuple(TRAINER_ADAPTERS)
EXPORT_TRAINERS: tuple[str, ...] = tuple(TRAINER_EXPORTS)
