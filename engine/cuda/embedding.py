"""Host side of the token-embedding gather (`cuda_src/embedding.cu`).

The table is the model's `token_embd` uploaded like any Q8_0 weight (`Q8Weight`: qs int8 [vocab][D],
d fp16 [vocab][D/32]); ids are an int32 device buffer, so a captured decode graph embeds whatever token
the sampler wrote there. Rows for ids outside the table come out as NaN (see the kernel).
"""

from __future__ import annotations

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream
from engine.cuda.gemv import Q8Weight

EMBED_THREADS = 256


def embed_q8_0(
    card: CudaCard,
    table: Q8Weight,
    ids: DeviceBuffer,
    out: DeviceBuffer,
    n_tokens: int,
    stream: Stream | None = None,
) -> None:
    """out[t] = dequantised table row ids[t] (fp32 [n_tokens][D]) for t < n_tokens."""
    if len(table.segments) != 1:
        raise ValueError("the embedding table must be a single matrix, not a stack")
    if n_tokens < 1 or ids.nbytes < 4 * n_tokens or out.nbytes < 4 * n_tokens * table.k:
        raise ValueError(f"{n_tokens} tokens need {4 * n_tokens} bytes of ids and {4 * n_tokens * table.k} of output")
    card.kernel("embed_q8_0").launch(
        n_tokens,
        EMBED_THREADS,
        table.qs,
        table.d,
        ids,
        out,
        np.int32(n_tokens),
        np.int32(table.k),
        np.int32(table.rows),
        stream=stream,
    )
