# One of the five prototypes of bench/cli_libraries/run.sh (not part of prefdata).
from typing import Optional
import typer
app = typer.Typer()
@app.command()
def prepare(raw: str, out: str, tokenizer: Optional[str] = typer.Option(None, help="Hugging Face tokenizer directory"),
            max_length: Optional[int] = typer.Option(None, help="max prompt+completion tokens per half"),
            max_prompt_length: Optional[int] = typer.Option(None, help="max prompt tokens"),
            chat_template: bool = typer.Option(False, help="render through the chat template"),
            pairing: str = typer.Option("best-worst", help="scored completions -> pairs"),
            top_k: int = typer.Option(2, help="pairs per prompt"), workers: Optional[int] = typer.Option(None, help="processes"),
            batch_size: int = typer.Option(1000, help="records per batch")):
    print(raw)
@app.command()
def validate(input: str, max_length: Optional[int] = typer.Option(None, help="max tokens")):
    print(input)
if __name__ == "__main__":
    app()
