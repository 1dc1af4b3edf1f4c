"""The check policies shipped with prefdata (package data): default.toml (the built-in default) and
pr.toml (strict, for pull requests). Load them by name: `--policy default`, `--policy pr`."""
