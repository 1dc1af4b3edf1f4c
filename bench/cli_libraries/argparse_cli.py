# One of the five prototypes of bench/cli_libraries/run.sh (not part of prefdata).
import argparse
p = argparse.ArgumentParser(prog="prefdata"); sub = p.add_subparsers(dest="command")
s = sub.add_parser("prepare"); s.add_argument("raw"); s.add_argument("out")
s.add_argument("--tokenizer", help="Hugging Face tokenizer directory"); s.add_argument("--max-length", type=int, help="max tokens")
s.add_argument("--max-prompt-length", type=int, help="max prompt tokens"); s.add_argument("--chat-template", action="store_true", help="chat")
s.add_argument("--pairing", choices=["best-worst", "best-vs-random-lower", "all-pairs", "top-k"], help="pairs")
s.add_argument("--top-k", type=int, default=2, help="pairs per prompt"); s.add_argument("--workers", type=int, help="processes")
s.add_argument("--batch-size", type=int, default=1000, help="records per batch")
v = sub.add_parser("validate"); v.add_argument("input"); v.add_argument("--max-length", type=int, help="max tokens")
print(p.parse_args())
