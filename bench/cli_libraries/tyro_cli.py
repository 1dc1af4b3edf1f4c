# One of the five prototypes of bench/cli_libraries/run.sh (not part of prefdata).
import sys, tyro
from model import Prepare
@__import__("dataclasses").dataclass
class Validate:
    input: str
    """input"""
    max_length: int | None = None
    """max tokens"""
if __name__ == "__main__":
    print(tyro.extras.subcommand_cli_from_dict({"prepare": Prepare, "validate": Validate}))
