"""Each command's settings, declared once (prefdata.settings.commands), and the machinery that turns
the declaration into flags, TOML keys, `--help` and docs tables (prefdata.settings.declare), and
settings read from a config file (prefdata.settings.config)."""
