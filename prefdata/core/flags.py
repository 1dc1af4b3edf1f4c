"""Stable flag names, generated from the checks (prefdata/checks/units/, one module per check, with its
meaning, default severity and hint) by `python -m prefdata.checks.generated`: do not edit by hand. Policies,
reports and tests refer to these constants."""

IDENTICAL = "identical"
WHITESPACE_ONLY = "whitespace_only"
NEAR_DUPLICATE = "near_duplicate"
IDENTICAL_AFTER_TRUNCATION = "identical_after_truncation"
EMPTY_PROMPT = "empty_prompt"
EMPTY_CHOSEN = "empty_chosen"
EMPTY_REJECTED = "empty_rejected"
NO_COMPLETION_TOKENS = "no_completion_tokens"
COMPLETION_TRUNCATED = "completion_truncated"
PROMPT_BOUNDARY_MISMATCH = "prompt_boundary_mismatch"
DUPLICATE_PAIR = "duplicate_pair"
CONFLICTING_PAIR = "conflicting_pair"
MULTI_TURN_COMPLETION = "multi_turn_completion"
PROMPT_LEAK = "prompt_leak"
NON_FINITE_REF_LOGPS = "non_finite_ref_logps"
TIED_REWARD = "tied_reward"
REWARD_DISAGREES = "reward_disagrees"
REASONING_LOST = "reasoning_lost"
SYSTEM_LOST = "system_lost"
REASONING_MISMATCH = "reasoning_mismatch"
SAME_FINAL_ANSWER = "same_final_answer"
TOOL_CALL_INVALID = "tool_call_invalid"
BENCHMARK_OVERLAP = "benchmark_overlap"
IMAGE_MISMATCH = "image_mismatch"
IMAGE_TRUNCATED = "image_truncated"
LENGTH_BALANCE = "length_balance"
ENVIRONMENT_DIFFERS = "environment_differs"
DIVERGES_AT_NON_MODEL_TURN = "diverges_at_non_model_turn"
NO_TRAINED_TOKENS = "no_trained_tokens"
UNEQUAL_TURNS = "unequal_turns"
TURN_RENDERS_DIFFERENTLY = "turn_renders_differently"
NOT_SELECTED = "not_selected"

ALL_FLAGS: tuple[str, ...] = (
    IDENTICAL,
    WHITESPACE_ONLY,
    NEAR_DUPLICATE,
    IDENTICAL_AFTER_TRUNCATION,
    EMPTY_PROMPT,
    EMPTY_CHOSEN,
    EMPTY_REJECTED,
    NO_COMPLETION_TOKENS,
    COMPLETION_TRUNCATED,
    PROMPT_BOUNDARY_MISMATCH,
    DUPLICATE_PAIR,
    CONFLICTING_PAIR,
    MULTI_TURN_COMPLETION,
    PROMPT_LEAK,
    NON_FINITE_REF_LOGPS,
    TIED_REWARD,
    REWARD_DISAGREES,
    REASONING_LOST,
    SYSTEM_LOST,
    REASONING_MISMATCH,
    SAME_FINAL_ANSWER,
    TOOL_CALL_INVALID,
    BENCHMARK_OVERLAP,
    IMAGE_MISMATCH,
    IMAGE_TRUNCATED,
    LENGTH_BALANCE,
    ENVIRONMENT_DIFFERS,
    DIVERGES_AT_NON_MODEL_TURN,
    NO_TRAINED_TOKENS,
    UNEQUAL_TURNS,
    TURN_RENDERS_DIFFERENTLY,
    NOT_SELECTED,
)

# Flags that need token ids (only computed when a tokenizer is given or the rows are pre-tokenized).
TOKEN_FLAGS = frozenset({
    IDENTICAL_AFTER_TRUNCATION,
    NO_COMPLETION_TOKENS,
    COMPLETION_TRUNCATED,
    PROMPT_BOUNDARY_MISMATCH,
    REASONING_LOST,
    SYSTEM_LOST,
    IMAGE_TRUNCATED,
    NO_TRAINED_TOKENS,
    TURN_RENDERS_DIFFERENTLY,
})
