"""Publishing a quantized GGUF to the Hugging Face hub with its model card (``publish``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from quantscope.core.fsutil import printable, read_text_input, write_atomic

from .common import CLIError

REPO_HELP = "the hub repository, ORG/NAME (created if missing; HF_TOKEN or a saved token writes to it)"


def _card(args: argparse.Namespace) -> str:
    from quantscope.core import modelcard
    from quantscope.core.gguf import GGUFError
    from quantscope.core.gguf.reader import GGUFFile

    try:
        rules = read_text_input(args.rules, "--rules") if args.rules else None
        report = modelcard.read_report(args.report) if args.report else None
        with GGUFFile(args.file) as f:
            return modelcard.model_card(f, args.repo, Path(args.file).name, base=args.base_model, rules=rules,
                                        report=report)
    except (GGUFError, modelcard.CardError, OSError) as exc:
        raise CLIError(str(exc)) from None


def cmd_publish(args: argparse.Namespace) -> int:
    """Upload FILE and its generated model card (README.md) to REPO in one commit; --dry-run prints the card."""
    if args.repo.count("/") != 1 or any(not p or p.startswith(".") for p in args.repo.split("/")):
        raise CLIError(f"{args.repo}: a hub repository is ORG/NAME")
    card = _card(args)
    if args.card_out:
        write_atomic(args.card_out, card, "--card-out", [args.file])
    if args.dry_run:
        if not args.card_out:
            print(card, end="")
        return 0
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    name = Path(args.file).name
    try:
        api.create_repo(args.repo, repo_type="model", private=args.private, exist_ok=True)
        info = api.create_commit(args.repo, repo_type="model", commit_message=f"Add {name} (quantscope publish)",
                                 operations=[CommitOperationAdd(path_in_repo=name, path_or_fileobj=args.file),
                                             CommitOperationAdd(path_in_repo="README.md",
                                                                path_or_fileobj=card.encode("utf-8"))])
    except HfHubHTTPError as exc:
        raise CLIError(f"the hub refused {args.repo}: {str(exc).splitlines()[0]}") from None
    except OSError as exc:
        raise CLIError(f"cannot upload {name}: {exc.strerror or exc}") from None
    print(printable(f"published {name} ({os.path.getsize(args.file):,} bytes) and README.md to {args.repo}: "
                    f"{info.commit_url}"))
    return 0


def register(sub: Any) -> None:
    """Add this module's sub-commands to ``sub``."""
    s = sub.add_parser("publish", help="upload a quantized GGUF to the Hugging Face hub with a generated model card "
                       "(base model, architecture, parameters, every tensor type with its share, the importance "
                       "matrix, the --tensor-type rules, the KLD figures of a target-size report)")
    s.add_argument("file", help="the GGUF to publish")
    s.add_argument("repo", help=REPO_HELP)
    s.add_argument("--base-model", help="the base model's hub id (default: the file's general.base_model keys)")
    s.add_argument("--rules", metavar="FILE", help="the --tensor-type rule file it was quantized with")
    s.add_argument("--report", metavar="FILE", help="the JSON of `quantscope quantize --target-size … --json`: "
                   "its KLD figures go into the card")
    s.add_argument("--private", action="store_true", help="create the repository private")
    s.add_argument("--dry-run", action="store_true", help="print the model card; upload nothing")
    s.add_argument("--card-out", metavar="FILE", help="also write the model card to FILE")
    s.set_defaults(func=cmd_publish)
