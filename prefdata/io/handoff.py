"""What travels inside OUT's dataset itself (its `DatasetInfo`) so `datasets.load_from_disk(OUT)` alone
is enough to check a trainer against the settings OUT was prepared with.

`DatasetInfo` has no free-form field, so the settings go into `description` as one JSON object
under the key "prefdata". `datasets` keeps `info` through `add_column`/`select_columns`/`save_to_disk`,
so the settings survive `prefdata refs` rewriting the dataset.
"""

from __future__ import annotations

import json
from typing import Any

INFO_KEY = "prefdata"
# The settings a trainer must agree with; written by `prepare`.
SETTINGS_KEYS = (
    "format_version", "prefdata_version", "max_length", "max_prompt_length", "chat_template",
    "tokenizer_path", "tokenizer_fingerprint", "pad_token_id", "eos_token_id", "content_hash", "text_columns",
    "template_fingerprint", "loss_on", "template_kwargs", "template_date", "chat_template_file", "chat_template_sha256",
    "chat_template_text",
)


def describe(settings: dict[str, Any]) -> str:
    """The `DatasetInfo.description` text that carries `settings`."""
    return json.dumps({INFO_KEY: settings}, sort_keys=True)


def read_settings(description: str | None) -> dict[str, Any] | None:
    """The settings `describe` wrote, or None when the description holds none (not prefdata's output)."""
    if not description:
        return None
    try:
        value = json.loads(description)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get(INFO_KEY), dict):
        return None
    return value[INFO_KEY]
