// The blocked device payload of Q8_0 weights (engine/cuda/q8_layout.py block_q8_payload is its numpy oracle).
//
// A row's K int8 values are K/32 blocks of 32, each two 16-byte halves. The row is cut into chunks of 32 blocks
// (1,024 bytes; the last chunk holds the m = K/32 - 32 * (chunks - 1) blocks left over), and inside a chunk of m
// blocks the 16-byte unit j + m * h holds half h of block j. Lane j of a GEMV warp so finds both halves of block j
// in two coalesced 512-byte loads and folds the block's 32 products into fp32 once (gemv_q8.cu). The scales `d`
// stay [rows][K/32] in block order, and every row still starts at row * K bytes.
#pragma once

namespace rigllm {

constexpr int Q8_CHUNK_BLOCKS = 32;  // blocks per chunk (1,024 bytes of a row)

// Chunks in a row of `n_blocks` blocks.
__device__ __forceinline__ int q8_chunks(int n_blocks) { return (n_blocks + Q8_CHUNK_BLOCKS - 1) / Q8_CHUNK_BLOCKS; }

// m, the blocks in chunk `chunk` of a row of `n_blocks` blocks: 32 but in a short last chunk, and <= 0 past the
// row's end, so `lane < q8_chunk_blocks(c, n)` says whether lane j has a block j in chunk c.
__device__ __forceinline__ int q8_chunk_blocks(int chunk, int n_blocks) {
    return min(Q8_CHUNK_BLOCKS, n_blocks - chunk * Q8_CHUNK_BLOCKS);
}

// The blocked unit (16-byte index from the row's start) of natural unit `unit` (bytes 16 * unit .. + 15 of the
// row: half unit % 2 of block unit / 2) in a row of `n_blocks` blocks.
__device__ __forceinline__ int q8_blocked_unit(int unit, int n_blocks) {
    const int block = unit >> 1;
    const int chunk = block / Q8_CHUNK_BLOCKS;
    const int m = q8_chunk_blocks(chunk, n_blocks);
    return chunk * 2 * Q8_CHUNK_BLOCKS + (block - chunk * Q8_CHUNK_BLOCKS) + m * (unit & 1);
}

}  // namespace rigllm
