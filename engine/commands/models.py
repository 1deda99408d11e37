"""`rigllm models search|files|list|rm`: find Qwen3.5/3.6 GGUFs on the Hugging Face Hub, see which file fits
the cards, and manage the models folder (`rigllm pull` downloads)."""

from __future__ import annotations

import argparse

from engine.commands.hub_args import add_fit, add_models_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="search the Hugging Face Hub for GGUFs; list or delete downloaded models",
                                   description="Search the Hub (HF_ENDPOINT, HF_TOKEN and HTTPS_PROXY are honoured), "
                                   "list a repository's files with a fit verdict, and manage the models folder.")
    sub = parser.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    search = sub.add_parser("search", help="GGUF repositories matching QUERY, runnable ones first")
    search.add_argument("query", nargs="+")
    search.add_argument("--limit", type=int, default=40)
    search.set_defaults(func=run_search)
    files = sub.add_parser("files", help="a repository's GGUF files: size, quant, fit verdict, paired mmproj")
    files.add_argument("repo", help="owner/name")
    add_fit(files)
    files.add_argument("--no-vision", action="store_true", help="price without the paired mmproj's vision tower")
    files.set_defaults(func=run_files)
    listing = sub.add_parser("list", help="the models in the models folder")
    add_models_dir(listing)
    listing.set_defaults(func=run_list)
    rm = sub.add_parser("rm", help="delete a model (and its mmproj when no other model beside it needs it)")
    rm.add_argument("name", help="a path, owner/repo/file, or a unique file name (see `rigllm models list`)")
    add_models_dir(rm)
    rm.set_defaults(func=run_rm)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n < 1e9 else f"{n / 1e9:,.2f} GB"


def run_search(args: argparse.Namespace) -> int:
    from engine.hub.catalog import search
    from engine.hub.names import params_label

    hits = search(" ".join(args.query), limit=args.limit)
    if not hits:
        print("no GGUF repositories match")
        return 0
    for h in hits:
        params = params_label(h.parameters)
        mark = {True: "runs ", False: "no   ", None: "?    "}[h.runnable]
        gated = " · gated" if h.gated else ""
        print(f"{mark} {h.repo}  ({h.architecture or 'arch ?'} · {params} · {h.downloads:,} downloads{gated}) {h.note}")
    return 0


def run_files(args: argparse.Namespace) -> int:
    from engine.commands.hub_args import cards_of
    from engine.hub.catalog import list_repo
    from engine.hub.fit import price_repo
    from engine.hub.session import HubAccess

    cards, which = cards_of(args)
    access = HubAccess()
    listing = list_repo(args.repo, access)
    prices = price_repo(listing, cards, args.context, args.kv, access, with_vision=not args.no_vision)
    print(f"{listing.repo} @ {listing.commit[:12]} · {listing.note} · priced on {which}, KV {args.kv}")
    for f in listing.files:
        if f.name.kind == "mmproj":
            verdict = "vision projector" + (" (paired: pulled with the model)" if f.name.name == listing.mmproj else "")
        else:
            verdict = prices.verdicts[f.name.name].text
        print(f"  {f.name.name:<52} {f.name.quant or '?':<8} {_mb(f.size):>11}  {verdict}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from engine.hub.library import Library

    library = Library(args.models_dir)
    entries = library.entries()
    if not entries:
        print(f"no models in {library.root} (get one with `rigllm pull REPO`)")
        return 0
    for e in entries:
        vision = "vision" if e.vision else "text"
        print(f"{e.name:<64} {e.quant or '?':<8} {_mb(e.size):>11}  {vision:<6} last used {e.last_used or 'never'}")
    return 0


def run_rm(args: argparse.Namespace) -> int:
    from engine.hub.library import Library

    library = Library(args.models_dir)
    for path in library.remove(library.find(args.name)):
        print(f"deleted {path}")
    return 0
