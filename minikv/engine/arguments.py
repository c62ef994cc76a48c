"""Command-line argument helpers shared by `minikv` and the subcommands that parse their own options.

The reproductions (`minikv repro ...`), the benchmarks and the hunter each build their own parser; they take these
from here rather than from `minikv.cli`, which imports them (a module below the command line, so no import circle).
"""
from __future__ import annotations

import argparse


class UsageParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (with a pointer to --help) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def whole_number(minimum: int):
    """argparse type: a whole number of at least `minimum`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


positive_int = whole_number(1)


def byte_count(text: str) -> int:
    """argparse type: a byte count, as an integer or with a binary unit (64MiB, 1GiB, 512k)."""
    from minikv.engine.memory import parse_bytes
    try:
        return parse_bytes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def share(text: str) -> float:
    """argparse type: a fraction in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1], got {text!r}")
    return value


def model_arg(parser: argparse.ArgumentParser, default: str = "tiny-gemma4") -> None:
    """--model: a shipped model name or a checkpoint directory (checked by minikv.LLM, as LLM(model=...) is)."""
    from minikv.models.registry import MODEL_NAMES
    parser.add_argument("--model", default=default, metavar="NAME|PATH",
                        help=f"a shipped model ({', '.join(MODEL_NAMES)}) or the path of a checkpoint directory "
                             f"in transformers' format (default {default})")


def device_and_backend_args(parser: argparse.ArgumentParser) -> None:
    """--device and --backend as the reproductions take them; `resolve_backend(args)` fills in the default."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default=None, choices=("triton", "torch"),
                        help="kernel backend (default: triton on cuda; torch on cpu, where the Triton interpreter "
                             "would take many minutes: the defect lives in the engine's Python, which both backends "
                             "run)")


def resolve_backend(args: argparse.Namespace) -> None:
    """The backend --backend names, or the default for --device: triton on a GPU, torch on a CPU."""
    args.backend = args.backend or ("triton" if args.device.startswith("cuda") else "torch")
