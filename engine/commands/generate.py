"""`rigllm generate [MODEL] --prompt TEXT`: stream a chat reply to the terminal, then tokens/s.

With no model it uses the generated demo model (random weights, labelled as such), so a fresh
install shows the whole pipeline working without downloading anything. `--image FILE` (repeatable)
puts images before the prompt text; it needs the model's mmproj (found beside the model, or
`--mmproj`). The CUDA backend loads the vision tower onto its (first) card and encodes the images
there; the reference backend runs the numpy tower.

A model with an MTP head decodes speculatively (`--mtp on`, the default; the head drafts `--mtp-draft`
tokens per verify) on the reference backend; the closing stats line then gives the acceptance rate.
Speculation never changes what is sampled, only how many forward passes it takes.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.commands.placement_args import add_placement_args, placement_options
from engine.backends import BACKEND_CHOICES

if TYPE_CHECKING:
    from engine.generation.backend import Backend
    from engine.generation.speculative_stream import SpeculativeStream
    from engine.generation.tokenizer import Tokenizer
    from engine.gguf.loader import LoadedModel
    from engine.vision.encoder import ImageEncoder
    from engine.vision.preprocess import PreparedImage


@dataclass(frozen=True)
class _Images:
    """`--image` files prepared for the tower, before any backend is open."""

    encoder: ImageEncoder
    prepared: list[PreparedImage]
    pad: int
    mmproj_name: str


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="stream a reply from a model (default: the random-weight demo model)")
    p.add_argument("model", nargs="?", help="a qwen35 GGUF file (omit for the demo model)")
    p.add_argument("--prompt", required=True, help="the user message")
    p.add_argument("--system", help="an optional system message")
    p.add_argument("--raw", action="store_true", help="feed the prompt as-is, without the chat template")
    p.add_argument("--image", action="append", default=[], metavar="FILE",
                   help="an image to show the model (repeatable; needs the model's mmproj)")
    p.add_argument("--mmproj", metavar="PATH", help="the vision mmproj GGUF (default: the one beside the model)")
    thinking = p.add_mutually_exclusive_group()
    thinking.add_argument("--think", dest="thinking", action="store_const", const=True, help="turn thinking on")
    thinking.add_argument("--no-think", dest="thinking", action="store_const", const=False, help="turn thinking off")
    p.add_argument("--hide-thinking", action="store_true", help="do not print the reasoning part")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    add_placement_args(p)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--mtp", choices=("on", "off"), default="on",
                   help="speculative decoding with the model's MTP head, when it has one (default on)")
    p.add_argument("--mtp-draft", type=int, choices=(1, 2), default=1, help="tokens the head drafts per verify")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.errors import RigllmError
    from engine.backends import open_backend
    from engine.generation.chat_prompt import build_chat_prompt
    from engine.generation.chat_template import ChatTemplate
    from engine.generation.detokenizer import IncrementalDetokenizer
    from engine.generation.output_parser import ContentDelta, OutputParser, ReasoningDelta
    from engine.generation.sampler import Sampler, SamplingParams
    from engine.generation.token_stream import TokenStream
    from engine.generation.tokenizer import Tokenizer
    from engine.fixtures.demo_model import ensure_demo_model
    from engine.gguf.loader import load_model

    if args.max_tokens < 1:
        raise RigllmError("--max-tokens must be at least 1")
    params = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, seed=args.seed,
    )
    if args.model is None:
        path = ensure_demo_model()
        print("[rigllm] no model given: using the demo model (random weights, its output is gibberish)", file=sys.stderr)
    else:
        path = args.model
    loaded = load_model(path)
    tokenizer = Tokenizer.from_model_file(loaded.file)
    context = loaded.config.context_length
    if args.image and args.raw:
        raise RigllmError("--image needs the chat template (it places the image markers); drop --raw")
    if args.raw:
        prompt_ids, thinking = tokenizer.encode(args.prompt, parse_special=True), False
        if len(prompt_ids) >= context:
            raise RigllmError(f"the prompt is {len(prompt_ids)} tokens, the context holds {context}")
    else:
        images = [{"type": "image"} for _ in args.image]
        user = images + [{"type": "text", "text": args.prompt}] if images else args.prompt
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": user}
        ]
        prompt = build_chat_prompt(ChatTemplate.for_model(loaded.file.fields), tokenizer, messages,
                                   enable_thinking=args.thinking, context_length=context)
        prompt_ids, thinking = prompt.token_ids, prompt.thinking
    images = _prepare_images(args, loaded, tokenizer) if args.image else None
    n_prompt = len(prompt_ids)
    if images is not None:
        n_prompt += sum(p.n_tokens - 1 for p in images.prepared)
        if n_prompt >= context:
            raise RigllmError(f"the prompt with its images is {n_prompt} tokens, the context holds {context}")
    max_tokens = min(args.max_tokens, context - n_prompt)
    backend = open_backend(args.backend, loaded, context=n_prompt + max_tokens,
                           mmproj=images.encoder.mmproj if images is not None else None,
                           speculative=args.mtp == "on" and images is None, draft_tokens=args.mtp_draft,
                           **placement_options(args))
    speculative = None
    if images is not None:
        try:
            backend, prompt_ids = _with_images(backend, images, prompt_ids)
        except BaseException:
            backend.close()
            raise
    else:
        speculative = _speculative(args, backend)
    backend = speculative or backend

    stream = TokenStream(backend, prompt_ids, Sampler(params), max_tokens, tokenizer.eos_ids)
    detok = IncrementalDetokenizer(tokenizer)
    parser = OutputParser(thinking=thinking)
    in_reasoning = False

    def show(events: list) -> None:
        nonlocal in_reasoning
        for event in events:
            if isinstance(event, ReasoningDelta):
                if args.hide_thinking:
                    continue
                if not in_reasoning:
                    sys.stdout.write("<think>\n")
                    in_reasoning = True
                sys.stdout.write(event.text)
            elif isinstance(event, ContentDelta):
                if in_reasoning:
                    sys.stdout.write("\n</think>\n\n")
                    in_reasoning = False
                sys.stdout.write(event.text)
        sys.stdout.flush()

    print(f"[rigllm] {loaded.path.name} on the {backend.name} backend, prompt {len(prompt_ids)} tokens", file=sys.stderr)
    try:
        for token in stream:
            show(parser.feed(detok.add(token)))
    finally:
        backend.close()
    show(parser.feed(detok.flush()) + parser.finish())
    if in_reasoning:
        sys.stdout.write("\n</think>")
    sys.stdout.write("\n")
    s = stream.stats
    print(
        f"[rigllm] {s.generated_tokens} tokens ({s.stop_reason}); prefill {s.prompt_tokens} tokens at "
        f"{s.prefill_tokens_per_second:.1f} t/s; decode {s.decode_tokens_per_second:.1f} t/s",
        file=sys.stderr,
    )
    spec_stats = speculative.stats if speculative is not None else getattr(backend, "speculation_stats", None)
    if spec_stats is not None:
        print(f"[rigllm] {spec_stats.summary()}", file=sys.stderr)
    return 0


def _speculative(args: argparse.Namespace, backend: Backend) -> SpeculativeStream | None:
    """The speculating view of a reference `backend` when `--mtp on` and its model has an MTP head (the CUDA
    backend speculates by itself, on one card or several, see `open_backend`)."""
    from engine.reference.backend import ReferenceBackend
    from engine.generation.speculative_stream import SpeculativeStream

    if args.mtp == "off":
        return None
    if isinstance(backend, ReferenceBackend):
        return SpeculativeStream(backend, args.mtp_draft) if backend.model.mtp else None
    if backend.config.n_mtp and getattr(backend, "speculation_stats", None) is None:
        print(f"[rigllm] this model's MTP head runs on the reference backend only (its own embedding or LM head); this "
              f"{backend.name} backend decodes one token per step", file=sys.stderr)
    return None


def _prepare_images(args: argparse.Namespace, loaded: LoadedModel, tokenizer: Tokenizer) -> _Images:
    """The model's mmproj and `args.image` decoded and resized for its tower (errors before any backend opens)."""
    from engine.errors import RigllmError
    from engine.vision.mmproj_pairing import find_mmproj
    from engine.vision.encoder import ImageEncoder
    from engine.vision.image_io import load_image_file
    from engine.vision.multimodal_prompt import IMAGE_PAD

    mmproj = args.mmproj or find_mmproj(loaded.path, loaded.config.d_model)
    if mmproj is None:
        raise RigllmError(
            f"no mmproj (vision tower) beside {loaded.path.name}; pass one with --mmproj "
            "(rigllm convert writes mmproj-<model>.gguf from an HF checkpoint with a vision tower)"
        )
    pad = tokenizer.token_to_id(IMAGE_PAD)
    if pad is None:
        raise RigllmError(f"{loaded.path.name} has no {IMAGE_PAD} token; it cannot take images")
    encoder = ImageEncoder.open(mmproj, loaded.config.d_model, loaded.path.name)
    return _Images(encoder, [encoder.prepare(load_image_file(path)) for path in args.image], pad, Path(mmproj).name)


def _with_images(backend: Backend, images: _Images, prompt_ids: list[int]) -> tuple[Backend, list[int]]:
    """Encode the images (on the backend's card when it holds the tower, else with the numpy tower) and
    return the backend that prefills the expanded prompt, with the prompt's ids."""
    from engine.errors import RigllmError
    from engine.reference.backend import ReferenceBackend
    from engine.vision.multimodal_prompt import EncodedImage, expand_image_pads
    from engine.vision.prompt_backend import EmbeddedPromptBackend, ImagePromptBackend

    on_card = getattr(backend, "supports_images", False) and hasattr(backend, "forward_embedded")
    if on_card:
        encode = backend.encode_image  # type: ignore[attr-defined]
    elif isinstance(backend, ReferenceBackend):
        encode = images.encoder.tower.encode
    else:
        raise RigllmError(f"the {backend.name} backend takes no images")
    encoded = [EncodedImage(p.merged_grid, encode(p)) for p in images.prepared]
    prompt = expand_image_pads(prompt_ids, encoded, images.pad)
    where = f"on {backend.name}" if on_card else "in numpy"
    print(f"[rigllm] {len(encoded)} image(s), {len(prompt.embedding_rows)} image tokens, vision tower "
          f"{images.mmproj_name} ({where})", file=sys.stderr)
    wrapped = EmbeddedPromptBackend(backend, prompt) if on_card else ImagePromptBackend(backend.model, prompt)
    return wrapped, prompt.token_ids  # type: ignore[return-value]
